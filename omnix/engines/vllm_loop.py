"""A vLLM stage's engine loop: one request, one vLLM sub-request per input piece.

Owns: ``Generation``, one ``generate`` call.  It runs one vLLM request per
input piece, in order, with sub-request ids ``f"{request_id}#{seq}"``: a
talker fed by the thinker sentence by sentence speaks the first sentence
while the thinker still writes the second.  Each sub-request streams as it
runs; the next piece starts when the previous one finished.  Every output
says which input piece produced it (``EngineOutput.piece``, counting empty
pieces too); the last one carries the counts and the finish reason.  An
abort (``Live.aborted``) stops it: no output is yielded after it.  Also
``Live`` (what ``generate`` and ``abort`` share) and the input pump that
moves pieces into it as they come.

A sub-request vLLM ends by itself fails the request: ``error`` (a failure
of vLLM's, such as a multimodal cache miss) raises, and so does ``abort``,
which vLLM (v1, 0.32) makes on its own only when its engine core stops
serving (shut down by SIGTERM/SIGINT, paused or put to sleep in abort
mode, or its fault handler): that raises ``EngineDead``, so the worker
exits and its replica is replaced, and the request continues elsewhere or
fails (never a finish the orchestrator would wait on forever).

Does not own prompts (``vllm_prompt.py``), continuation
(``vllm_resume.py``), sampling (``vllm_sampling.py``) nor the engine's
lifecycle (``vllm_engine.py``).
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from omnix.engines.vllm_capture import read_capture
from omnix.engines.vllm_outputs import codec_frames, finish_reason, token_logprobs
from omnix.engines.vllm_prompt import PromptRenderer
from omnix.engines.vllm_resume import ContinuedText, ResumePlan, resumed_ids
from omnix.engines.vllm_sampling import budget, sampling_params
from omnix.engines.vllm_setup import VocabLayout
from omnix.engines.vllm_tools import RequestParse
from omnix.events.types import TokenLogprob, ToolCallDelta
from omnix.pipelines.config import VllmArgs
from omnix.stages.engine import EngineDead
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece


class Live:
    """Per-request bookkeeping shared by ``generate`` and ``abort``."""

    __slots__ = ("aborted", "ended", "error", "pieces", "sub_id", "wake")

    def __init__(self) -> None:
        self.sub_id: str | None = None
        self.aborted = False
        self.pieces: collections.deque[InputPiece] = collections.deque()
        self.ended = False
        self.error: BaseException | None = None
        self.wake = asyncio.Event()


@dataclass(frozen=True, slots=True)
class Loaded:
    """What a started engine runs requests with: the ``AsyncLLM``, the
    model's layout, folder and tokenizer, the ids vLLM ends a text
    sub-request on, the prompt renderer, vLLM's ``EngineDeadError``, and
    whether the stage feeds a Qwen3-Omni talker."""

    llm: Any
    layout: VocabLayout
    folder: Path | None
    tokenizer: Any
    eos_ids: frozenset[int]
    prompts: PromptRenderer
    dead: type[BaseException]
    #: the context the engine runs with, as vLLM resolved it (the stage
    #: may leave it to vLLM, or name it in engine_args)
    max_model_len: int
    #: emit the talker's context before the first piece's text (see
    #: ``VllmArgs.talker_context``)
    talker_context: bool = False
    #: vLLM's parser class for the stage's output (``vllm_tools.stage_parser``;
    #: None: its text is the answer as it comes)
    parser: Any = None


class _Sub:
    """One prepared sub-request (a non-empty input piece going to vLLM)."""

    __slots__ = ("carry", "continued", "engine_input", "params", "sub_id")

    def __init__(
        self, sub_id: str, engine_input: Any, params: Any, continued: ContinuedText | None
    ) -> None:
        self.sub_id = sub_id
        self.engine_input = engine_input
        self.params = params
        self.continued = continued
        self.carry: list[int] = []  # codec codes of an incomplete frame


class Generation:
    """One request's run: ``run()`` is what ``VllmEngine.generate`` returns
    (``loaded`` None: the engine is not started, or closed).  ``args`` are
    the stage's as the call found them (tests switch ``input_mode`` between
    calls on one engine).  Its ``Live`` is in ``requests`` (for ``abort``)
    from its first step until it ends."""

    m: Loaded
    live: Live

    def __init__(
        self,
        loaded: Loaded | None,
        args: VllmArgs,
        request: GenerateRequest,
        inputs: AsyncIterator[InputPiece],
        requests: dict[str, Live],
    ) -> None:
        self._loaded = loaded
        self.args = args
        self.codec = args.output_modality == "codec"
        self.request = request
        self.inputs = inputs
        self.requests = requests
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.finish = ""
        self.final_sent = False
        # Alternatives per token when the request asked for logprobs, else None.
        self.top_lps: int | None = None
        self.seq = 0  # sub-requests (non-empty pieces): each has a seed of its own
        self.index = -1  # input pieces, empty ones included (EngineOutput.piece)
        self.parse: RequestParse | None = None

    async def run(self) -> AsyncIterator[EngineOutput]:
        rid = self.request.request_id
        if self._loaded is None:
            raise RuntimeError("VllmEngine.generate before start() (or after close())")
        if rid in self.requests:
            raise ValueError(f"request {rid!r} is already running on this engine")
        m = self.m = self._loaded
        self.top_lps = None if self.codec else self.request.params.logprobs
        params = self.request.params
        self.parse = (
            RequestParse(m.parser, m.tokenizer, params)
            if (m.parser is not None or params.tools) and not self.codec
            else None
        )
        live = self.live = self.requests[rid] = Live()
        pump = None
        try:
            # The first piece normally came with the work.  Taken here rather
            # than through the pump task, the request reaches vLLM in this
            # task's first step: a burst's adds then run back to back, before
            # the worker's next loop turn sends the burst's Started records,
            # whose handling by the server would otherwise take the CPU in the
            # middle of them (measured at concurrency 32: the burst reached the
            # engine core ~2 ms later).
            await _take_first(self.inputs, live)
            if not live.ended:
                pump = asyncio.create_task(_pump(self.inputs, live), name=f"vllm-inputs-{rid}")
            plan = ResumePlan(self.request.resume)
            while (piece := await _next_piece(live)) is not None:
                self.index += 1
                sub = await self._prepare(piece, plan)
                if sub is None:
                    continue
                live.sub_id = sub.sub_id
                stream = m.llm.generate(sub.engine_input, sub.params, sub.sub_id)
                context = (
                    m.talker_context
                    and self.request.feeds
                    and self.index == 0
                    and self.request.resume is None
                )
                try:
                    async for out in stream:
                        if live.aborted:
                            return
                        if context:
                            context = False
                            yield await self._context(out, sub.sub_id)
                        got = self._translate(out, sub)
                        if got is not None:
                            yield got
                except m.dead as exc:
                    raise EngineDead(f"vLLM's engine core is gone ({exc})") from exc
                finally:
                    live.sub_id = None
                    await stream.aclose()  # vLLM aborts a request whose stream is closed early
            if live.aborted:
                return
            if live.error is not None:
                raise live.error
            if not self.final_sent:
                yield EngineOutput(
                    modality=self.args.output_modality,
                    prompt_tokens=self.prompt_tokens,
                    output_tokens=self.output_tokens,
                    finish_reason=self.finish or "stop",
                )
        finally:
            if pump is not None:
                pump.cancel()
            self.requests.pop(rid, None)

    async def _prepare(self, piece: InputPiece, plan: ResumePlan) -> _Sub | None:
        """The sub-request for input piece ``self.index``, or None when
        nothing goes to vLLM: an empty piece, a continued piece that had
        finished, or one whose budget the lost replica used up."""
        m, request = self.m, self.request
        tools = json.loads(request.params.tools) if request.params.tools else None
        prompt = m.prompts.prompt_ids(piece, self.args, tools)
        if not prompt:
            return None  # an empty piece (e.g. whitespace the upstream flushed)
        media = m.prompts.media(piece) if piece.media else None
        resume = plan.take(self.index, request)
        resumed: tuple[int, ...] = ()
        skip = False
        if resume is not None:
            self.output_tokens += len(resume.token_ids)
            ended = bool(resume.token_ids) and resume.token_ids[-1] in m.eos_ids
            # All its outputs were delivered before the move (a text
            # piece delivers the EOS it stopped on).
            skip = resume.finished or (ended and not self.codec)
            resumed = () if skip else resume.token_ids
        extra = resumed_ids(resumed, self.codec, m.layout, m.folder) if resumed else []
        kwargs = m.prompts.processor_kwargs(piece) if piece.media else None
        # A thinker feeding its talker records hidden states at the media
        # positions as its prefill computes them; a prefix-cache hit (the
        # same media sent again) would skip them, so such a prompt shares
        # no cached blocks.
        key = f"{request.request_id}#{self.seq}"
        salt = key if media and m.talker_context else None
        engine_input, n_prompt = await m.prompts.render(prompt, extra, media, kwargs, key, salt)
        self.prompt_tokens += n_prompt
        try:
            left = budget(request, m.max_model_len, n_prompt) - len(resumed)
            if skip or left <= 0:
                # Nothing runs: with nothing left of the budget, the lost
                # replica had used it all.
                m.prompts.unsent(engine_input)
                self.seq += 1
                self.finish = "stop" if skip else "length"
                return None
            structured = self.parse.structured if self.parse is not None else None
            params = sampling_params(request, left, self.seq, self.codec, m.layout, structured)
        except BaseException:
            m.prompts.unsent(engine_input)
            raise
        sub_id = f"{request.request_id}#{self.seq}"
        self.seq += 1
        continued = (
            ContinuedText(m.tokenizer, resume.token_ids, resume.text)
            if resume is not None and not self.codec and m.tokenizer is not None
            else None
        )
        return _Sub(sub_id, engine_input, params, continued)

    def _translate(self, out: Any, sub: _Sub) -> EngineOutput | None:
        """One of vLLM's DELTA outputs as an ``EngineOutput`` (None: nothing
        to yield); the last piece's finish carries the counts."""
        m = self.m
        comp = out.outputs[0]
        ids = tuple(comp.token_ids)
        self.output_tokens += len(ids)
        if self.codec:
            ids, sub.carry = codec_frames(sub.carry, ids, m.layout)
            text = ""
        elif sub.continued is not None:
            stop = comp.stop_reason if isinstance(comp.stop_reason, str) else None
            text = sub.continued.delta(ids, stop)
        else:
            text = comp.text
        lps = () if self.top_lps is None else token_logprobs(comp.logprobs, ids, self.top_lps)
        reasoning = ""
        calls: tuple[ToolCallDelta, ...] = ()
        if self.parse is not None:
            split = self.parse.feed(text, ids, out.prompt_token_ids, out.finished)
            text, reasoning, calls = split.content, split.reasoning, split.tool_calls
        if out.finished:
            self.finish = finish_reason(comp.finish_reason)
            self._check_finish(sub.sub_id)
            live = self.live
            if live.ended and not live.pieces:
                self.final_sent = True
                return self._output(text, ids, lps, self.finish, reasoning, calls)
        if text or ids:
            return self._output(text, ids, lps, "", reasoning, calls)
        return None

    async def _context(self, out: Any, sub_id: str) -> EngineOutput:
        """The talker's context, once the prompt is prefilled: the prompt's
        ids (media placeholders expanded, as vLLM ran them), the hidden
        states the capture recorded at its media positions, their grids."""
        (taken,) = await self.m.llm.collective_rpc("omnix_capture_take", args=(sub_id,))
        rows, grids = read_capture(taken)
        return EngineOutput(
            modality="hidden",
            token_ids=tuple(out.prompt_token_ids or ()),
            array=rows,
            text=msgspec.json.encode(grids).decode(),
            piece=self.index,
        )

    def _check_finish(self, sub_id: str) -> None:
        """Raise when vLLM ended the sub-request by itself (the stage did
        not finish): see the module docstring."""
        if self.finish == "error":
            # vLLM ended this request on an error of its own: the
            # stage failed (and may be retried), it did not finish.
            raise RuntimeError(
                f"vLLM ended sub-request {sub_id} with an error after "
                f"{self.output_tokens} tokens (see the worker's log)"
            )
        if self.finish == "aborted":  # live.aborted is False: nobody asked
            raise EngineDead(
                f"vLLM aborted sub-request {sub_id} on its own after {self.output_tokens} "
                "tokens: its engine core stopped serving (shut down by a signal, or paused)"
            )

    def _output(
        self,
        text: str,
        ids: tuple[int, ...],
        logprobs: tuple[TokenLogprob, ...],
        finish: str = "",
        reasoning: str = "",
        tool_calls: tuple[ToolCallDelta, ...] = (),
    ) -> EngineOutput:
        """An output of the current piece; with ``finish``, the request's
        last, with its counts."""
        return EngineOutput(
            modality=self.args.output_modality,
            text=text,
            token_ids=ids,
            prompt_tokens=self.prompt_tokens if finish else 0,
            output_tokens=self.output_tokens if finish else 0,
            finish_reason=finish,
            piece=self.index,
            logprobs=logprobs,
            reasoning=reasoning,
            tool_calls=tool_calls,
        )


async def _take_first(inputs: AsyncIterator[InputPiece], live: Live) -> None:
    """Wait for the first input piece (no suspension when it is already
    queued) and put it in ``live.pieces``; an input that ended or failed
    before it marks ``live`` as ``_pump`` would."""
    try:
        live.pieces.append(await anext(inputs))
    except StopAsyncIteration:
        live.ended = True
    except Exception as e:  # surfaced by Generation.run, which fails the request
        live.error = e
        live.ended = True


async def _pump(inputs: AsyncIterator[InputPiece], live: Live) -> None:
    """Move input pieces into ``live.pieces`` as they come, so the loop
    can tell (without blocking) whether the input has ended."""
    try:
        async for piece in inputs:
            live.pieces.append(piece)
            live.wake.set()
    except Exception as e:  # surfaced by Generation.run, which fails the request
        live.error = e
    finally:
        live.ended = True
        live.wake.set()


async def _next_piece(live: Live) -> InputPiece | None:
    while True:
        if live.aborted:
            return None
        if live.pieces:
            return live.pieces.popleft()
        if live.ended:
            return None
        live.wake.clear()
        await live.wake.wait()
