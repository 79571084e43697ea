"""What OpenAI-compatible servers send ``omnix bench serve``, parsed.

Owns: the response bodies the bench reads, as any server sends them
(omnix, vLLM, vLLM-Omni; unknown fields ignored): chat chunks, speech
events, image and model lists, error bodies in OpenAI's, vLLM's and
FastAPI's shapes; their decoders; and the one-line messages a failed
request is reported with (``RequestFailed``, HTTP errors, an unreachable
server, an unreadable body, audio that is not base64).  Does not own
sending requests (``serve_client``) nor SSE framing (``omnix.testing.sse``).
"""

from __future__ import annotations

import base64
import os
from typing import Any

import msgspec


class _ErrorObj(msgspec.Struct):
    message: str = ""
    type: str = ""
    code: str | int | None = None


class _AudioDelta(msgspec.Struct):
    data: str | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    audio: _AudioDelta | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    audio: _AudioDelta | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    message: _Message | None = None


class Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None


class ChatChunk(msgspec.Struct):
    """A ``chat.completion(.chunk)`` as any server sends it; unknown fields
    are ignored.  ``modality`` is vLLM-Omni's: its audio chunks carry the
    base64 audio in ``delta.content``."""

    choices: list[_Choice] | None = None
    usage: Usage | None = None
    error: _ErrorObj | str | None = None
    modality: str | None = None


class _SpeechEvent(msgspec.Struct):
    type: str = ""
    audio: str | None = None
    error: _ErrorObj | str | None = None


class _Image(msgspec.Struct):
    b64_json: str | None = None
    url: str | None = None


class _ImagesBody(msgspec.Struct):
    data: list[_Image] = []


class _ModelCard(msgspec.Struct):
    id: str


class _ModelList(msgspec.Struct):
    data: list[_ModelCard] = []


class _ErrorBody(msgspec.Struct):
    """OpenAI's ``{"error": {...}}``, vLLM's ``{"message": ...}``,
    FastAPI's ``{"detail": ...}``."""

    error: _ErrorObj | str | None = None
    message: str | None = None
    detail: Any = None


chunk_decoder = msgspec.json.Decoder(ChatChunk)
speech_decoder = msgspec.json.Decoder(_SpeechEvent)
images_decoder = msgspec.json.Decoder(_ImagesBody)
models_decoder = msgspec.json.Decoder(_ModelList)
error_decoder = msgspec.json.Decoder(_ErrorBody)


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def error_text(err: _ErrorObj | str | None) -> str:
    if isinstance(err, _ErrorObj):
        return err.message or err.type or str(err.code or "")
    return err or ""


def unreachable(base: str, exc: Any) -> str:
    """``ClientConnectorError`` as "cannot reach URL: Connection refused"."""
    os_error = getattr(exc, "os_error", None)
    errno = getattr(os_error, "errno", None)
    # uvloop's strerror is "Connect call failed (...)": name the errno instead.
    why = os.strerror(errno) if isinstance(errno, int) and errno > 0 else ""
    why = why or getattr(os_error, "strerror", None) or str(os_error or exc)
    return one_line(f"cannot reach {base}: {why}")


def http_error(status: int, body: bytes) -> str:
    msg = ""
    try:
        eb = error_decoder.decode(body)
        msg = error_text(eb.error) or eb.message or (str(eb.detail) if eb.detail else "")
    except msgspec.DecodeError:
        msg = body.decode("utf-8", "replace")
    return one_line(f"HTTP {status}: {msg}" if msg else f"HTTP {status}")


class RequestFailed(Exception):
    """A request failed; the message is the one line reported."""


def decode_body(decoder: Any, raw: bytes) -> Any:
    try:
        return decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise RequestFailed(one_line(f"unreadable response ({exc}): {raw[:120]!r}")) from None


def b64_audio(data: str) -> bytes:
    try:
        return base64.b64decode(data)
    except ValueError as exc:
        raise RequestFailed(f"audio data is not base64: {exc}") from None
