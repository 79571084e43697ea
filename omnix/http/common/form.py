"""Multipart forms: OpenAI's upload routes read theirs the same way.

Owns ``read_form``: a ``multipart/form-data`` body (any other is 400
``invalid_form``; aiohttp answers 413 past ``client_max_size``) read into
its text fields and its uploaded files, refusing, each with a 400 naming
the field: a field the route does not know (``unknown_field``), one
OpenAI has and the route does not take (``unsupported_parameter``, with
what to do), a text field sent twice, a file where a text field belongs
or the reverse, text that is not UTF-8.  A file field may repeat when the
route says so (``image`` and ``image[]``: the openai client sends a list
as ``image[]``).  ``Upload``: one uploaded file.  ``form_struct``: the text
fields as the route's Struct (numbers and booleans from their text), its
errors about a form field rather than a JSON body.

Does not own what any field means (each route's plan) nor decoding files.
"""

from __future__ import annotations

import asyncio
from typing import Final, TypeVar

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_request import FileField

from omnix.http.core.errors import ApiError, from_decode_error

_T = TypeVar("_T")


class Upload(msgspec.Struct, frozen=True):
    """An uploaded file: its bytes and what the client called it."""

    data: bytes
    filename: str
    content_type: str


class FormSpec(msgspec.Struct, frozen=True):
    """What one route's form holds.  ``route``: ``"POST /v1/..."`` for
    messages; ``hint``: how to send the form; ``texts``: its text fields;
    ``files``: its file fields; ``repeat``: file fields that may come more
    than once (also as ``name[]``); ``unsupported``: OpenAI's fields the
    route does not take, with what to do instead."""

    route: str
    hint: str
    texts: frozenset[str]
    files: frozenset[str]
    repeat: frozenset[str] = frozenset()
    unsupported: dict[str, str] = {}


class Form(msgspec.Struct, frozen=True):
    """A form as read: its non-empty text fields and its files by field."""

    texts: dict[str, str]
    files: dict[str, list[Upload]]


def _bad(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


async def read_form(request: web.Request, spec: FormSpec) -> Form:
    """The form's fields and files; raises ``ApiError`` 400 naming the
    field at fault."""
    if request.content_type != "multipart/form-data":
        got = request.content_type or "no Content-Type"
        raise _bad(
            None,
            f"{spec.route} takes a multipart/form-data body, got {got}: {spec.hint}.",
            "invalid_form",
        )
    try:
        fields = await request.post()  # bounded by client_max_size (413)
    except web.HTTPException:
        raise
    except (ValueError, AssertionError, HttpProcessingError) as exc:
        why = (exc.message if isinstance(exc, HttpProcessingError) else str(exc)).strip()
        raise _bad(
            None,
            f"The multipart/form-data body could not be read ({why or type(exc).__name__}): "
            f"{spec.hint}.",
            "invalid_form",
        ) from None
    texts: dict[str, str] = {}
    seen: set[str] = set()
    uploads: dict[str, list[FileField]] = {}
    for key, value in fields.items():
        name = key.removesuffix("[]")
        if name in spec.unsupported:
            raise _bad(
                key, f"{key} is not supported: {spec.unsupported[name]}", "unsupported_parameter"
            )
        known = name in spec.texts or name in spec.files
        if not known or (key != name and name not in spec.repeat):
            listed = ", ".join(sorted(spec.files | spec.texts))
            raise _bad(
                key,
                f"Unknown form field {key!r}: this route takes {listed}. Remove it.",
                "unknown_field",
            )
        if name in spec.files:
            if not isinstance(value, FileField):
                raise _bad(
                    name,
                    f"{name} must be an uploaded file (a part with a filename, as "
                    f"curl -F {name}=@file sends it), not a text field.",
                )
            if name in uploads and name not in spec.repeat:
                raise _bad(name, f"The form has {name!r} more than once: send it once.")
            uploads.setdefault(name, []).append(value)
            continue
        if key in seen:
            raise _bad(key, f"The form has {key!r} more than once: send it once.")
        seen.add(key)
        if isinstance(value, FileField):
            raise _bad(key, f"{key} must be a text field, not a file.")
        # A part with a non-text Content-Type comes as bytes.
        text = value if isinstance(value, str) else _utf8(key, bytes(value))
        if text != "":  # an empty field is an absent one
            texts[name] = text
    # Spooled files may sit on disk: read them off the loop.
    files = await asyncio.to_thread(_read_all, uploads)
    return Form(texts=texts, files=files)


def _read_all(uploads: dict[str, list[FileField]]) -> dict[str, list[Upload]]:
    return {name: [_read_and_close(f) for f in got] for name, got in uploads.items()}


def _read_and_close(upload: FileField) -> Upload:
    with upload.file:
        data = upload.file.read()
    return Upload(data=data, filename=upload.filename, content_type=upload.content_type)


def _utf8(key: str, value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(key, f"{key} is not UTF-8 text: send it as a text field.") from None


#: ``form_struct``'s words for a form (msgspec's are about a JSON body).
_BODY: Final = "Invalid request body at"


def form_struct(texts: dict[str, str], type_: type[_T]) -> _T:
    """The text fields as ``type_`` (numbers and booleans converted from
    their text); a bad value is the 400 naming its field."""
    try:
        return msgspec.convert(texts, type_, strict=False)
    except msgspec.ValidationError as exc:
        err = from_decode_error(exc)
        message = err.message.replace(_BODY, "Invalid form field", 1)
        raise ApiError(err.status, message, param=err.param, code=err.code) from None
