"""A deterministic test engine: scripted outputs, failures, crashes and hangs.

Owns: ``ScriptedEngine``, the engine behind ``kind = "scripted"`` stages.
It exists to test the runtime and the orchestrator with real worker
processes and no model; it is never a product default.

Behaviour (all deterministic; ``n`` counts outputs of one request from 0):

* For each input piece it yields ``chunks_per_piece`` outputs (each
  saying which piece it answers, ``EngineOutput.piece``), sleeping
  ``delay_ms`` before each: text ``"t{n} "``; for ``output_modality =
  "codec"`` one codec frame ``token_ids=(n,)``; for ``"audio"`` a small
  float32 array (240 samples of value ``n``); for ``"image"`` opaque bytes
  (``media_type="application/x-scripted"``).  With ``echo`` each piece
  yields one output carrying the piece back (its text, the last message's
  content, its token ids or its array).
* A continuation (``request.resume``, a migrated execution) gets every
  input piece again and skips its first ``resume.chunks`` outputs (no
  delay, no fault: they were delivered before the move), so its outputs
  are exactly those an undisturbed run makes after them; the
  ``crash_at``/``fail_at``/``hang_at`` faults still fire at their index
  past that point.
* ``params.num_inference_steps = K`` makes it report K progress steps
  before each piece's outputs (exercises Progress events).
* ``params.logprobs = K`` gives each text output fake logprobs: one
  token (its text) at logprob ``-0.5 * (n + 1)``, with K alternatives, the
  token itself first, then ``"alt{j}"`` at ``-0.5 * (n + 1) - j``.
* ``params.max_tokens`` stops the request with ``finish_reason="length"``
  after that many outputs, otherwise ``"stop"``: reported on a final
  payload-free output (not a chunk) with ``prompt_tokens`` = number of
  input pieces and ``output_tokens`` = number of outputs.
* ``fail_at = n`` raises ``ScriptedFailure`` instead of output n;
  ``refuse_at = n`` raises ``ValueError`` there (the request's own input
  refused: the request fails without a continuation);
  ``crash_at = n`` kills the whole worker process (``os._exit(1)``, no
  goodbye, exactly like a segfault or an OOM kill); ``hang_at = n`` stops
  producing forever (until aborted).
* ``start_delay_ms`` blocks the event loop in ``start()`` with
  ``time.sleep``, as vLLM's model loading does, so tests can check that
  heartbeats flow from their thread meanwhile.
* ``close_delay_ms`` makes ``close()`` take that long (awaited, as vLLM's
  engine teardown is awaited in a thread), for tests of the runtime's
  shutdown grace.
* ``leave_child`` makes ``start()`` spawn a daemon process (it sleeps) that
  ``close()`` leaves running, as a vLLM engine core is left when its close
  runs out of time; its pid goes to the journal (event ``child``).
* With ``delay_ms == 0`` it still yields to the loop every few outputs so
  aborts and other requests get served.

``OMNIX_SCRIPTED_FAIL_START=TEXT`` in the environment makes ``start()``
raise (an engine that cannot load), for tests of startup errors.

Journal: when the environment variable ``OMNIX_SCRIPTED_JOURNAL`` names a
file, the engine appends one JSON line per lifecycle call (``start``,
``generate``, ``abort``, ``close``) with its pid and the request id.  Tests
read it to check that the engine *saw* an abort, or that work was dropped
and never executed.  ``engine.aborted`` holds the same for in-process use.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from typing import assert_never

import numpy as np

from omnix.events.types import TokenLogprob
from omnix.pipelines.config import ScriptedArgs
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece

JOURNAL_ENV = "OMNIX_SCRIPTED_JOURNAL"
FAIL_START_ENV = "OMNIX_SCRIPTED_FAIL_START"  # non-empty: start() raises with this text
_YIELD_EVERY = 16  # with delay_ms == 0: give the loop a turn this often


def _fake_logprobs(text: str, n: int, top: int) -> tuple[TokenLogprob, ...]:
    lp = -0.5 * (n + 1)
    alts = ((text, lp), *((f"alt{j}", lp - j) for j in range(1, top)))
    return (TokenLogprob(token=text, logprob=lp, top=alts[:top]),)


class ScriptedFailure(RuntimeError):
    """The failure ``fail_at`` asks for."""


class ScriptedEngine:
    def __init__(self, args: ScriptedArgs) -> None:
        if not isinstance(args, ScriptedArgs):
            raise TypeError(f"ScriptedEngine needs ScriptedArgs, got {type(args).__name__}")
        self.args = args
        self.aborted: list[str] = []
        self._journal = os.environ.get(JOURNAL_ENV) or None

    def _note(self, event: str, request_id: str = "", **extra: int) -> None:
        if self._journal is None:
            return
        line = json.dumps({"pid": os.getpid(), "event": event, "request_id": request_id, **extra})
        with open(self._journal, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    async def start(self) -> EngineInfo:
        if reason := os.environ.get(FAIL_START_ENV):
            raise RuntimeError(f"scripted start failure: {reason}")
        if self.args.start_delay_ms > 0:
            # Deliberately blocking: this is what a real model load does to the loop.
            time.sleep(self.args.start_delay_ms / 1000)  # noqa: ASYNC251
        self._note("start")
        if self.args.leave_child:
            import multiprocessing

            child = multiprocessing.get_context("spawn").Process(
                target=time.sleep, args=(3600,), daemon=True
            )
            child.start()
            self._note("child", child_pid=child.pid or 0)
        return EngineInfo(
            engine="scripted", capacity=self.args.capacity, device="cpu", model="scripted"
        )

    async def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        a = self.args
        rid = request.request_id
        self._note("generate", rid)
        delay = a.delay_ms / 1000
        steps = request.params.num_inference_steps or 0
        max_tokens = request.params.max_tokens
        n = 0
        pieces = 0
        skip = request.resume.chunks if request.resume is not None else 0
        async for piece in inputs:
            pieces += 1
            for step in range(1, steps + 1):
                yield EngineOutput(modality=a.output_modality, step=step, total=steps)
            count = 1 if a.echo else a.chunks_per_piece
            for _ in range(count):
                if max_tokens is not None and n >= max_tokens:
                    break
                if n < skip:  # delivered before the migration: not again
                    n += 1
                    continue
                if delay > 0:
                    await asyncio.sleep(delay)
                elif n % _YIELD_EVERY == _YIELD_EVERY - 1:
                    await asyncio.sleep(0)
                if n == a.crash_at:
                    os._exit(1)  # a hard crash: no goodbye, no flush, no cleanup
                if n == a.fail_at:
                    raise ScriptedFailure(f"scripted failure at output {n} of request {rid}")
                if n == a.refuse_at:
                    raise ValueError(f"scripted refusal of request {rid}'s input at output {n}")
                if n == a.hang_at:
                    await asyncio.Event().wait()  # until cancelled
                out = self._echo(piece) if a.echo else self._output(n)
                out.piece = pieces - 1  # the input piece it answers
                if request.params.logprobs is not None and out.modality == "text":
                    out.logprobs = _fake_logprobs(out.text, n, request.params.logprobs)
                yield out
                n += 1
            if max_tokens is not None and n >= max_tokens:
                break
        # A payload-free last output carries the finish metadata (as vLLM's
        # final delta often does); the worker does not count it as a chunk.
        yield EngineOutput(
            modality=a.output_modality,
            finish_reason="length" if max_tokens is not None and n >= max_tokens else "stop",
            prompt_tokens=pieces,
            output_tokens=n,
        )

    def _output(self, n: int) -> EngineOutput:
        m = self.args.output_modality
        match m:
            case "text":
                return EngineOutput(modality="text", text=f"t{n} ")
            case "codec":
                return EngineOutput(modality="codec", token_ids=(n,))
            case "audio":
                return EngineOutput(modality="audio", array=np.full(240, n, dtype=np.float32))
            case "image":
                return EngineOutput(
                    modality="image",
                    data=b"scripted-image-%d" % n,
                    media_type="application/x-scripted",
                )
            case "video":
                return EngineOutput(
                    modality="video",
                    data=b"scripted-video-%d" % n,
                    media_type="application/x-scripted",
                )
            case _:
                assert_never(m)

    def _echo(self, piece: InputPiece) -> EngineOutput:
        m = self.args.output_modality
        if piece.array is not None:
            return EngineOutput(modality=m, array=piece.array)
        if piece.token_ids:
            return EngineOutput(modality=m, token_ids=piece.token_ids)
        text = piece.text or (piece.messages[-1].content if piece.messages else "")
        return EngineOutput(modality=m, text=text)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self._note("abort", request_id)

    async def close(self) -> None:
        if self.args.close_delay_ms > 0:
            await asyncio.sleep(self.args.close_delay_ms / 1000)
        self._note("close")
