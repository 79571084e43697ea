"""``GET /v1/models``, ``POST /tokenize``, ``POST /detokenize``.

Owns the handlers: the served pipeline as OpenAI's model list (one card
per served name, as vLLM lists its ``--served-model-name``s; on a pipeline
that makes audio, what its speech route takes: ``speech_fields``), and vLLM's
tokenizer routes on the first stage's tokenizer (chat messages counted as
the chat route counts them: text parts only; 404 on a pipeline whose
first stage has none).  The tokenizer routes are left out of the
document: vLLM's operational routes, outside the OpenAI API.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from omnix.events.types import ChatMessage
from omnix.http.audio.speech_tts import speech_fields
from omnix.http.common import doc
from omnix.http.common.fields import Message, TextPart
from omnix.http.core.body import read_body
from omnix.http.core.errors import ApiError
from omnix.http.core.respond import json_response
from omnix.http.core.route import DocContext, Route, Undescribed
from omnix.http.core.server import Server
from omnix.http.models.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)


async def models(server: Server, request: web.Request) -> web.Response:
    p = server.omni.pipeline
    limit = server.tokens.max_model_len
    speech = speech_fields(server.served) if "audio" in p.outputs else None
    cards = [
        ModelCard(
            id=name,
            created=server.started_at,
            root=p.name,
            max_model_len=limit or None,
            modalities=list(p.outputs),
            stages=list(server.omni.graph.stage_names),
            speech=speech,
        )
        for name in server.served.names
    ]
    return json_response(ModelList(data=cards))


async def _tokenizer(server: Server) -> Any:
    tok = await server.tokens.tokenizer()
    if tok is None:
        raise ApiError(
            404,
            f"pipeline {server.omni.pipeline.name!r} has no tokenizer to offer: its first stage "
            f"({server.tokens.stage!r}) is not a vLLM stage whose model folder has one.",
            code="tokenizer_unavailable",
        )
    return tok


def _text_message(where: str, m: Message) -> ChatMessage:
    """A /tokenize message: its text parts (media have no tokens until the
    model's processor expands them)."""
    c = m.content
    if c is None or isinstance(c, str):
        return ChatMessage(role=m.role, content=c or "")
    if not all(isinstance(p, TextPart) for p in c):
        raise ApiError(
            400,
            f"{where}: /tokenize counts text only; send the message's text parts.",
            param=where,
            code="unsupported_input",
        )
    return ChatMessage(role=m.role, content="\n".join(p.text for p in c if isinstance(p, TextPart)))


async def tokenize(server: Server, request: web.Request) -> web.Response:
    """vLLM's ``POST /tokenize``: the ids the first stage's tokenizer
    gives a prompt, or chat messages as its chat template renders them."""
    body = await read_body(request, TokenizeRequest)
    server.served.check_model(body.model or "")
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(
            400, "Give a prompt or messages (one of them).", param="prompt", code="invalid_value"
        )
    tok = await _tokenizer(server)
    tokens = server.tokens
    if body.messages is not None:
        messages = tuple(_text_message(f"messages[{i}]", m) for i, m in enumerate(body.messages))
        ids = await asyncio.to_thread(tokens.prompt_ids, tok, messages)
    else:
        special = True if body.add_special_tokens is None else body.add_special_tokens
        ids = await asyncio.to_thread(tok.encode, body.prompt, add_special_tokens=special)
    strs = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return json_response(
        TokenizeResponse(
            count=len(ids), max_model_len=tokens.max_model_len, tokens=ids, token_strs=strs
        )
    )


async def detokenize(server: Server, request: web.Request) -> web.Response:
    """vLLM's ``POST /detokenize``."""
    body = await read_body(request, DetokenizeRequest)
    server.served.check_model(body.model or "")
    tok = await _tokenizer(server)
    if body.tokens and max(body.tokens) >= len(tok):
        raise ApiError(
            400,
            f"token id {max(body.tokens)} is outside the vocabulary (0..{len(tok) - 1}).",
            param="tokens",
            code="invalid_value",
        )
    text = await asyncio.to_thread(tok.decode, body.tokens)
    return json_response(DetokenizeResponse(prompt=text))


def _models_operation(ctx: DocContext) -> dict[str, Any]:
    return doc.get("The served pipeline as a model", doc.json_body(ModelList, "Model list"))


_VLLM_OPERATIONAL = Undescribed(
    "vLLM's operational routes, outside the OpenAI API (404 on a pipeline without a tokenizer)"
)

MODELS = Route("GET", "/v1/models", models, _models_operation, types=(ModelList,))
TOKENIZE = Route("POST", "/tokenize", tokenize, _VLLM_OPERATIONAL)
DETOKENIZE = Route("POST", "/detokenize", detokenize, _VLLM_OPERATIONAL)
