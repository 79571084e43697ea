"""GET /openapi.json: an OpenAPI 3.1 description of the HTTP API.

Owns: the list of routes with their summaries, parameters and responses.
Body schemas are generated from the msgspec Structs in ``schemas.py``
(``msgspec.json.schema_components``), so they cannot drift from what the
server decodes and encodes.  Streamed bodies (SSE, raw audio) are described
in prose: OpenAPI has no way to type an event stream.

Does not own the routes themselves (``routes.py`` registers them; a test
checks that both lists agree).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec
from aiohttp import web

from omnix import __version__
from omnix.http.errors import ErrorBody
from omnix.http.schemas import (
    CancelResult,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Health,
    ImageRequest,
    ImagesResponse,
    ModelList,
    Readiness,
    SpeechAudioDelta,
    SpeechAudioDone,
    SpeechRequest,
)

_TYPES = (
    ChatCompletionRequest,
    ChatCompletion,
    ChatCompletionChunk,
    SpeechRequest,
    SpeechAudioDelta,
    SpeechAudioDone,
    ImageRequest,
    ImagesResponse,
    ModelList,
    Health,
    Readiness,
    CancelResult,
    ErrorBody,
)


def _ref(t: type) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{t.__name__}"}


def _json(t: type, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(t)}}}


_ERRORS = {
    "400": _json(
        ErrorBody, "Invalid request body (bad JSON, wrong type, unknown field, out of range)"
    ),
    "401": _json(ErrorBody, "Missing or wrong API key (when the server has one)"),
    "404": _json(ErrorBody, "Unknown model"),
    "413": _json(ErrorBody, "Body larger than the server's limit"),
    "422": _json(ErrorBody, "Well-formed, but the pipeline cannot serve it (modality, n)"),
    "429": _json(ErrorBody, "Overloaded: retry after Retry-After seconds"),
    "500": _json(ErrorBody, "The request failed in a stage"),
    "503": _json(ErrorBody, "Not ready, or shutting down: retry after Retry-After seconds"),
}
_RID = {
    "X-Request-Id": {
        "description": "The omnix request id(s), comma-separated for a batch",
        "schema": {"type": "string"},
    }
}
_ID_PARAM = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}


def _post(summary: str, body: type, ok: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "description": description,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(body)}},
            },
            "responses": {"200": {**ok, "headers": _RID}, **_ERRORS},
        }
    }


def _get(
    summary: str,
    ok: dict[str, Any],
    *,
    params: list[dict[str, Any]] | None = None,
    errors: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A GET operation; ``errors`` are its responses by status code."""
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **(errors or {})}}
    if params:
        op["parameters"] = params
    return {"get": op}


@cache
def openapi_document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(
        _TYPES, ref_template="#/components/schemas/{name}"
    )
    not_found = _json(ErrorBody, "No such request")
    paths: dict[str, Any] = {
        "/v1/chat/completions": _post(
            "Chat completion (OpenAI-compatible)",
            ChatCompletionRequest,
            {
                "description": "A chat.completion object; with stream=true an SSE stream of "
                "chat.completion.chunk objects ending with `data: [DONE]`",
                "content": {
                    "application/json": {"schema": _ref(ChatCompletion)},
                    "text/event-stream": {"schema": _ref(ChatCompletionChunk)},
                },
            },
            "messages may be a list of conversations (batch, one choice each). "
            "sampling_params_list: a list aligned with the pipeline's stages or a map by stage name.",
        ),
        "/v1/audio/speech": _post(
            "Text to speech (OpenAI-compatible)",
            SpeechRequest,
            {
                "description": "The audio file; stream_format=audio streams its bytes as generated, "
                "stream_format=sse streams speech.audio.delta / speech.audio.done events",
                "content": {
                    "audio/mpeg": {},
                    "audio/wav": {},
                    "audio/flac": {},
                    "audio/ogg": {},
                    "audio/aac": {},
                    "audio/pcm": {},
                    "text/event-stream": {
                        "schema": {"oneOf": [_ref(SpeechAudioDelta), _ref(SpeechAudioDone)]}
                    },
                },
            },
        ),
        "/v1/images/generations": _post(
            "Image generation (OpenAI-compatible)",
            ImageRequest,
            _json(ImagesResponse, "Generated images as base64 PNG"),
        ),
        "/v1/models": _get("The served pipeline as a model", _json(ModelList, "Model list")),
        "/health": _get("Liveness: the process answers", _json(Health, "Alive")),
        "/ready": _get(
            "Readiness: every stage has a ready replica",
            _json(Readiness, "Ready"),
            errors={"503": _json(Readiness, "Not ready")},
        ),
        "/metrics": _get(
            "Prometheus exposition of omnix's metrics",
            {"description": "Prometheus text format", "content": {"text/plain": {}}},
        ),
        "/v1/requests/{id}": _get(
            "A request's state, folded from its events",
            {"description": "RequestState as a JSON object", "content": {"application/json": {}}},
            params=[_ID_PARAM],
            errors={"404": not_found},
        ),
        "/v1/requests/{id}/events": _get(
            "SSE tail of a request's events (resumable with Last-Event-ID)",
            {
                "description": "`id:` is the log position, `event:` the type tag, `data:` the event "
                "as msgspec JSON; ends after the terminal event",
                "content": {"text/event-stream": {}},
            },
            params=[
                _ID_PARAM,
                {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                {"name": "format", "in": "query", "schema": {"enum": ["array", "object"]}},
            ],
            errors={"404": not_found},
        ),
        "/v1/requests/{id}/stream": _get(
            "The request's streamed response again: whole, or the rest after Last-Event-ID",
            {
                "description": "The same bytes as the original response (chat or speech SSE, "
                "raw audio from the start), live to the request's end; after Last-Event-ID, "
                "what followed that SSE event",
                "content": {"text/event-stream": {}, "audio/wav": {}, "audio/pcm": {}},
            },
            params=[
                _ID_PARAM,
                {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                {"name": "last_event_id", "in": "query", "schema": {"type": "string"}},
            ],
            errors={
                "400": _json(ErrorBody, "Not a streamed request, or not an event id of it"),
                "404": not_found,
            },
        ),
        "/v1/requests/{id}/cancel": {
            "post": {
                "summary": "Cancel a request (every active stage is aborted)",
                "parameters": [_ID_PARAM],
                "responses": {
                    "200": _json(CancelResult, "Cancel requested (or already ended)"),
                    "404": not_found,
                },
            }
        },
        "/v1/requests/{id}/trace": _get(
            "Download a replayable trace of the request",
            {"description": "Trace file", "content": {"application/octet-stream": {}}},
            params=[_ID_PARAM],
            errors={
                "404": not_found,
                "409": _json(ErrorBody, "Still running"),
                "501": _json(ErrorBody, "Not available"),
            },
        ),
        "/openapi.json": _get(
            "This document", {"description": "OpenAPI 3.1", "content": {"application/json": {}}}
        ),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "omnix",
            "version": __version__,
            "description": "OpenAI-compatible API of an omnix pipeline server, plus omnix's "
            "request introspection routes. See docs/http.md.",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }


_BODY: bytes | None = None


async def openapi_handler(request: web.Request) -> web.Response:
    global _BODY
    if _BODY is None:
        _BODY = msgspec.json.encode(openapi_document())
    return web.Response(body=_BODY, content_type="application/json")
