"""Tokens in the HTTP process: a prompt's length checked before admission,
and vLLM's ``/tokenize`` and ``/detokenize``.

Owns ``PromptTokens``: the tokenizer of the stage that reads a request's
prompt (the pipeline's first stage, when it is a vLLM stage whose model
folder has a tokenizer), loaded once, off the event loop (the routes
start loading it when the server starts);
counting a chat's prompt as that stage's engine builds it (its chat
template with the generation prompt for ``input_mode = "chat"``, the
joined text otherwise); and the 400 a request gets when its prompt, or its
prompt plus the ``max_tokens`` it asks of that stage, does not fit the
stage's ``max_model_len`` as its running engine reports it (as vLLM and
OpenAI answer, before anything is admitted).  The stage's chat template
(vLLM's ``--chat-template``) counts as the engine renders it.  Audio and image parts are not counted: the model's processor
expands them in the worker, so a prompt that fits here can still overflow
there with its media, and then fails as the engine's error.

Does not own the engine's own prompt building (``omnix.engines.vllm_engine``)
nor the routes that call it (``core.submit``, ``omnix.http.models.router``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from omnix.events.types import ChatMessage, RequestSpec
from omnix.http.core.errors import ApiError
from omnix.models.paths import read_info, resolve_model
from omnix.models.tokenizer import has_tokenizer, load_tokenizer
from omnix.pipelines.config import PipelineConfig, VllmArgs
from omnix.pipelines.vllm_args import load_chat_template, setting

#: The engine settings of a stage's ready replicas (``Omni.engine_settings``).
Settings = Callable[[str], list[dict[str, Any]]]


class PromptTokens:
    """The source stage's tokenizer, when it has one (``available``).

    ``settings`` gives what the stage's running engines report of their
    configuration: the context checked is the one vLLM resolved
    (``max_model_len`` read back from the engine), so a stage that leaves
    it to vLLM, or names it in ``engine_args``, is held to the engine's
    own; before any replica is ready it is the stage config's."""

    def __init__(self, pipeline: PipelineConfig, settings: Settings | None = None) -> None:
        source = pipeline.stages[0]
        engine = source.engine
        #: the stage whose prompt is counted
        self.stage = source.name
        self._args = engine if isinstance(engine, VllmArgs) else None
        self._settings = settings
        self._configured: int | None = None
        self._template: str | None = None
        self._tokenizer: Any = None
        self._loading: asyncio.Lock | None = None
        self._missing = self._args is None

    @property
    def max_model_len(self) -> int:
        """The stage's context in tokens (0: unknown, nothing is checked)."""
        if self._args is None:
            return 0
        for reported in self._settings(self.stage) if self._settings is not None else ():
            value = reported.get("max_model_len")
            if isinstance(value, int) and value > 0:
                return value
        if self._configured is None:
            value = setting(self._args, "max_model_len")
            self._configured = value if isinstance(value, int) and value > 0 else 0
        return self._configured

    @property
    def available(self) -> bool:
        return not self._missing

    async def tokenizer(self) -> Any:
        """The tokenizer (loaded on first call), or None when the stage has
        none (not vLLM, or a folder without one: the talker)."""
        if self._missing:
            return None
        if self._tokenizer is None:
            self._loading = self._loading or asyncio.Lock()
            async with self._loading:
                if self._tokenizer is None:
                    self._tokenizer = await asyncio.to_thread(self._load)
                    self._missing = self._tokenizer is None
        return self._tokenizer

    def _load(self) -> Any:
        assert self._args is not None
        try:
            folder = resolve_model(self._args.model)
        except (FileNotFoundError, ValueError):
            return None
        if self._args.chat_template:
            self._template = load_chat_template(self._args.chat_template)
        for where in (folder / "text_tokenizer", folder):
            if has_tokenizer(where):
                return load_tokenizer(where, saved_by_omnix=read_info(folder) is not None)
        return None

    # -- counting ---------------------------------------------------------------------
    def prompt_ids(self, tok: Any, messages: Sequence[ChatMessage], prompt: str = "") -> list[int]:
        """The prompt's token ids as the stage's engine builds them (media
        parts left out)."""
        assert self._args is not None
        if self._args.input_mode == "chat" and (
            self._template or getattr(tok, "chat_template", None)
        ):
            chat = [{"role": m.role, "content": m.content} for m in messages] or [
                {"role": "user", "content": prompt}
            ]
            ids = tok.apply_chat_template(
                chat, chat_template=self._template, add_generation_prompt=True, tokenize=True
            )
            # transformers 5 answers a BatchEncoding-like mapping for one chat.
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        text = "\n".join(m.content for m in messages) or prompt
        return list(tok.encode(text, add_special_tokens=self._args.input_mode != "token_ids"))

    async def check(self, spec: RequestSpec) -> None:
        """400 ``context_length_exceeded`` when the prompt, or the prompt
        plus the ``max_tokens`` the request asks of the stage, does not fit
        its ``max_model_len``; nothing when the stage has no tokenizer."""
        tok = await self.tokenizer()
        if tok is None:
            return
        if spec.raw_prompt is not None:
            # A completion prompt goes raw (``InputPiece.raw``): its ids as
            # given, or its text with the tokenizer's special tokens.
            if spec.raw_prompt.token_ids:
                n = len(spec.raw_prompt.token_ids)
            else:
                n = len(await asyncio.to_thread(tok.encode, spec.prompt, add_special_tokens=True))
        else:
            n = len(await asyncio.to_thread(self.prompt_ids, tok, spec.messages, spec.prompt))
        limit = self.max_model_len
        if limit <= 0:
            return
        asked = spec.stage_params.get(self.stage)
        max_tokens = asked.max_tokens if asked is not None else None
        param = "messages" if spec.messages else "prompt"
        if n >= limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your "
                f"{param} resulted in {n} tokens (stage {self.stage!r}). Please reduce the "
                f"length of the {param}.",
                param=param,
                code="context_length_exceeded",
            )
        if max_tokens is not None and n + max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n + max_tokens} tokens ({n} in the {param}, {max_tokens} in the completion). "
                f"Please reduce the length of the {param} or the completion (max_tokens at most "
                f"{limit - n}).",
                param="max_tokens",
                code="context_length_exceeded",
            )
