"""Qwen3-Omni's talker as a stage engine: batched decoding with a KV cache.

Owns: ``TalkerEngine``, which feeds each request's input (the thinker's
context, then its text as it streams) into ``TalkerModel`` and decodes
every ready request together, one frame a step, yielding each frame's
codes (all code groups) as the stage's output.  Does not own the model's
maths (``talker_model.py``) nor the waveform (``code2wav_engine.py``).

Why not vLLM: each talker step's input is the sum of the *previous
frame's* sixteen code embeddings (fifteen of them drawn by the code
predictor inside the step) and the next text position, and each step must
hand all sixteen codes on.  vLLM 0.32 feeds a decode step only the token
it sampled, returns only sampled tokens, and refuses prompt embeddings in
streamed-input requests; carrying the talker would need its model runner
patched (what vLLM-Omni does).  So this engine runs transformers' own
modules with continuous batching of its own; docs/engines.md says more.

Input pieces, in order: first the thinker's context (``modality ==
"hidden"``: ``token_ids`` its prompt ids with the media placeholders
expanded, ``array`` its hidden states at the talker's layer for the media
positions, ``text`` a JSON ``MediaGrids``), then text pieces whose
``token_ids`` are the thinker's generated ids.  The reference reads one
text position per frame and never the thinker's last token (its hidden
state was never computed), so frame ``j`` needs generated token ``j + 2``,
or the end of the text: a request whose next text is not in yet is set
aside (its cache kept) and rejoins the batch when it arrives.

Output: ``EngineOutput(modality="codec", token_ids=<the frame's codes>)``
per frame, then a payload-free output with ``finish_reason`` ("stop" at
codec end-of-speech, "length" at ``max_tokens``), the prefill length and
the frame count.

Continuation (``request.resume``): the inputs arrive again; the engine
prefills and then replays the ``resume.chunks`` frames already delivered
(``resume.token_ids``) as forced steps, so the frames after them continue
the delivered ones exactly, sampled or greedy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from omnix.engines.device import pick_device, use_own_stream
from omnix.models.paths import resolve_model
from omnix.pipelines.config import TalkerArgs
from omnix.transport.work import EngineInfo, EngineOutput, GenerateRequest, InputPiece

if TYPE_CHECKING:
    import torch

    from omnix.engines.talker_graphs import TalkerGraphs
    from omnix.engines.talker_model import BatchCache, Conditioning, Slot, TalkerModel
    from omnix.events.types import ChatMessage

log = logging.getLogger(__name__)

#: The reference's talker sampling (``generate``'s defaults).
DEFAULT_TEMPERATURE = 0.9
DEFAULT_TOP_K = 50
DEFAULT_REPETITION_PENALTY = 1.05
DEFAULT_MAX_TOKENS = 4096


class MediaGrids(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the talker's 3-D positions need of the prompt's media, as the
    processor measured them (the thinker stage sends it with its context)."""

    image_grid_thw: tuple[tuple[int, int, int], ...] = ()
    video_grid_thw: tuple[tuple[int, int, int], ...] = ()
    audio_seqlens: tuple[int, ...] = ()
    video_second_per_grid: tuple[float, ...] = ()
    #: videos heard with their sound tracks (Qwen3-Omni's use_audio_in_video)
    use_audio_in_video: bool = False


@dataclass
class _Request:
    rid: str
    request: GenerateRequest
    queue: asyncio.Queue[EngineOutput | BaseException | None]
    prompt_ids: list[int] | None = None
    media_hidden: Any = None
    grids: MediaGrids = field(default_factory=MediaGrids)
    text: list[int] = field(default_factory=list)
    utterance: str = ""  # a source stage's text (Qwen3-TTS: what to say)
    #: a source stage's messages and their media arrays (Qwen3-TTS Base:
    #: the reference audio to clone, its transcript the message's content)
    messages: tuple[ChatMessage, ...] = ()
    media: tuple[Any, ...] = ()
    reference: Any = None  # a voice cloned in context: its reference codes
    done: bool = False  # the text ended
    aborted: bool = False
    # decoding state (the engine thread's)
    slot: Slot | None = None
    cache: Any = None  # its own cache while set aside
    code: int = -1
    hidden: Any = None
    frames: int = 0
    prefill_len: int = 0
    forced: list[list[int]] = field(default_factory=list)  # delivered frames to replay
    trailing: dict[int, Any] = field(default_factory=dict)  # projected text, by frame
    #: Qwen3-TTS, text streamed in: ``utterance``'s length after each input
    #: piece; how many pieces, and how much of it, ``trailing`` holds (-1:
    #: the prompt holds the whole text); the row each piece's text starts at
    piece_ends: list[int] = field(default_factory=list)
    pieces_said: int = 0
    said: int = -1
    piece_rows: list[int] = field(default_factory=list)
    finished: bool = False
    row: int | None = None  # its slot in the graphs (static decoding)


class TalkerEngine:
    """``Engine`` over ``TalkerModel``.  Built as ``TalkerEngine(args)``;
    ``model`` hands it one already built (a bench's random-weight talker at
    the published sizes) instead of loading ``args.model``."""

    KIND = "qwen3_omni_talker"

    def __init__(self, args: TalkerArgs, model: TalkerModel | None = None) -> None:
        self.args = args
        self._prebuilt = model
        self.model: TalkerModel | None = None
        self.device = "cpu"
        self._reqs: dict[str, _Request] = {}
        self._batch: list[_Request] = []
        self._cache: BatchCache | None = None
        self._graphs: TalkerGraphs | None = None
        self._rows: dict[int, _Request] = {}  # slot -> request (static decoding)
        self._wake = asyncio.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self) -> EngineInfo:
        # Imported here, on the loop's thread, not first in the pool's: two
        # threads importing transformers at once can see it half-initialised
        # (a vLLM engine starting beside this one in one process does).
        import transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe  # noqa: F401

        from omnix.engines.talker_model import BatchCache

        # All torch work on one thread: steps never overlap and the worker's
        # event loop never blocks on them.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omnix-talker")
        loop = asyncio.get_running_loop()
        if self._prebuilt is not None:
            folder, self.model = self.args.model, self._prebuilt
            self.device = str(self.model.device)
        else:
            folder = str(resolve_model(self.args.model))
            self.device = pick_device(self.args.device)
            self.model = await loop.run_in_executor(
                self._pool, self._load, folder, self.device, self.args.dtype
            )
        if self.args.voice:
            self.model.speaker_id(self.args.voice)  # an unknown default voice fails at start
        await loop.run_in_executor(self._pool, lambda: use_own_stream(self.device, urgent=True))
        self._cache = BatchCache(self.model.talker.config.text_config)
        self._graphs = await loop.run_in_executor(self._pool, self._prepare_graphs)
        self._loop_task = asyncio.create_task(self._run(), name="omnix-talker-loop")
        return EngineInfo(
            engine=self.KIND,
            capacity=self.args.max_batch,
            device=self.device,
            model=str(folder),
        )

    # _load, _feed, _can_prefill, _conditioning, _trailing and _piece are what
    # another model on this machinery replaces (``qwen3_tts_engine.py``).
    @staticmethod
    def _load(folder: str, device: str, dtype: str) -> TalkerModel:
        from omnix.engines.talker_model import TalkerModel

        return TalkerModel.load(folder, device, dtype)

    def _prepare_graphs(self) -> TalkerGraphs | None:
        """The static decoder ``args.decode`` asks for (``auto``: CUDA
        graphs on a CUDA device, eager elsewhere), compiled and captured."""
        from omnix.engines.talker_graphs import TalkerGraphs, bucket_for

        assert self.model is not None
        args = self.args
        mode = args.decode
        if mode == "auto":
            mode = "graphs" if self.model.device.type == "cuda" else "eager"
        if mode == "eager":
            return None
        if mode == "graphs" and self.model.device.type != "cuda":
            raise ValueError(
                f"talker decode 'graphs' needs a CUDA device, but the talker is on "
                f"{self.model.device}: use decode 'auto', 'static' or 'eager'"
            )
        buckets = sorted(set(args.graph_buckets))
        if args.max_batch > buckets[-1]:
            raise ValueError(
                f"talker max_batch {args.max_batch} is larger than its largest graph bucket "
                f"{buckets[-1]}: add a bucket to graph_buckets or lower max_batch"
            )
        top = bucket_for(args.max_batch, buckets)
        graphs = TalkerGraphs(
            self.model,
            buckets=[b for b in buckets if b <= top],
            max_len=args.max_len,
            capture=mode == "graphs",
            compile=args.compile,
        )
        graphs.prepare(progress=log.info)
        return graphs

    # -- requests ------------------------------------------------------------

    def generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        return self._generate(request, inputs)

    async def _generate(
        self, request: GenerateRequest, inputs: AsyncIterator[InputPiece]
    ) -> AsyncIterator[EngineOutput]:
        if self.model is None:
            raise RuntimeError("TalkerEngine.generate before start() (or after close())")
        rid = request.request_id
        req = _Request(rid, request, asyncio.Queue())
        if request.resume is not None:
            groups = self.model.layout.num_code_groups
            ids = list(request.resume.token_ids)
            req.forced = [ids[i : i + groups] for i in range(0, len(ids), groups)]
        self._reqs[rid] = req
        feeder = asyncio.create_task(self._feed(req, inputs))
        try:
            while True:
                out = await req.queue.get()
                if out is None:
                    return
                if isinstance(out, BaseException):
                    raise out
                yield out
        finally:
            req.aborted = True
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
            self._wake.set()

    async def _feed(self, req: _Request, inputs: AsyncIterator[InputPiece]) -> None:
        try:
            async for piece in inputs:
                if piece.modality == "hidden":
                    req.grids = msgspec.json.decode(piece.text or "{}", type=MediaGrids)
                    req.media_hidden = piece.array
                    req.prompt_ids = list(piece.token_ids)
                else:
                    req.text.extend(piece.token_ids)
                self._wake.set()
        except Exception as exc:  # a bad piece fails the request, not the engine
            req.queue.put_nowait(exc)
            return
        req.done = True
        self._wake.set()

    async def abort(self, request_id: str) -> None:
        req = self._reqs.get(request_id)
        if req is not None:
            req.aborted = True
            req.queue.put_nowait(None)
            self._wake.set()

    async def close(self) -> None:
        self._closing = True  # a drive in progress ends after its step
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self.model = None

    # -- the decode loop -------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._pool is None:
                return
            await loop.run_in_executor(self._pool, self._drive, loop)

    def _drive(self, loop: asyncio.AbstractEventLoop) -> None:
        """Steps, on the engine thread, for as long as a request moves; each
        step's outputs go to the event loop as it ends, and the next step
        starts while the loop hands them on (a round trip through the loop
        between steps left the device idle while it served every stream).
        What the loop changes meanwhile (a request in, text in, an abort)
        the next step's round reads."""
        moved = True
        while moved and self._reqs and not self._closing:
            try:
                moved, results = self._tick()
            except Exception as exc:
                # A step that raised fails the requests it held, never the
                # loop: a dead loop would leave every request waiting.
                log.exception("talker step failed; failing the %d requests in it", len(self._reqs))
                moved, results = True, self._fail_all(exc)
            if results:
                loop.call_soon_threadsafe(_deliver, results)

    def _tick(self) -> tuple[bool, list[tuple[_Request, EngineOutput | BaseException | None]]]:
        """One round on the engine thread: drop what ended, prefill what can
        start, set aside rows whose next text is not in, bring back rows
        whose text came, then one decode step of the batch."""
        out: list[tuple[_Request, EngineOutput | BaseException | None]] = []
        room = self._graphs.free if self._graphs is not None else len(self._reqs)
        starting: list[_Request] = []
        for req in list(self._reqs.values()):
            if req.aborted:
                self._forget(req)
            elif req.slot is None and len(starting) < room and self._can_prefill(req):
                starting.append(req)
        moved = bool(starting)
        if starting:
            out += self._prefill(starting)
        if self._graphs is not None:
            stepped = self._graph_step()
            moved = moved or bool(stepped)
            out += stepped
            return moved, out
        self._regroup()
        if self._batch:
            moved = True
            out += self._step()
        # Not moved: every request waits for input; the loop sleeps until
        # a feeder wakes it.
        return moved, out

    def _fail_all(
        self, exc: BaseException
    ) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        """Every request ended with ``exc``, and the batch and its cache
        emptied (what a failed step left there is not to be trusted)."""
        failed = list(self._reqs.values())
        for req in failed:
            req.finished = True
        self._reqs.clear()
        self._batch.clear()
        if self.model is not None:
            from omnix.engines.talker_model import BatchCache

            self._cache = BatchCache(self.model.talker.config.text_config)
        if self._graphs is not None:
            while self._graphs.used:
                self._graphs.leave(self._graphs.used - 1)
            self._rows.clear()
        return [(req, exc) for req in failed]

    def _forget(self, req: _Request) -> None:
        req.finished = True
        if req.row is not None and self._graphs is not None:
            moved = self._graphs.leave(req.row)
            self._rows.pop(req.row)
            if moved is not None:
                other = self._rows.pop(moved)
                other.row = req.row
                self._rows[req.row] = other
            req.row = None
        if req in self._batch and self._cache is not None:
            i = self._batch.index(req)
            self._cache.take(i)
            self._batch.pop(i)
        self._reqs.pop(req.rid, None)

    @staticmethod
    def _usable(req: _Request) -> list[int]:
        """The generated ids the reference embeds: all but the last."""
        return req.text[:-1]

    def _can_prefill(self, req: _Request) -> bool:
        if req.prompt_ids is None or not (req.done or len(req.text) >= 2):
            return False
        if self._graphs is None:
            return True
        if self._graphs.free == 0:
            return False
        if not req.forced:
            return True
        # Static decoding replays a continuation's delivered frames at its
        # prefill, so the text of every one of them must be in.
        return req.done or len(self._usable(req)) > len(req.forced)

    def _trailing(self, req: _Request, j: int) -> torch.Tensor | None:
        """Frame ``j``'s text vector, or None while it is not known yet."""
        assert self.model is not None
        done = req.done
        usable = self._usable(req)
        import torch

        if j < len(usable) - 1:
            if j not in req.trailing:
                # Every text position known from here on, in one projection.
                ahead = torch.tensor(usable[j + 1 :])
                for k, row in enumerate(self.model.project_text(ahead)):
                    req.trailing[j + k] = row
            return req.trailing[j]
        if not done:
            return None
        return self.model.tts_eos if j == max(len(usable) - 1, 0) else self.model.tts_pad

    def _piece(self, req: _Request, j: int) -> int:
        """The input piece frame ``j`` speaks (``EngineOutput.piece``): the
        thinker's text is one stream, so its first."""
        return 0

    def _sampling(self, req: _Request) -> Any:
        import torch

        from omnix.engines.talker_model import Sampling

        p = req.request.params
        # On the model's device: CUDA draws take a CUDA generator.
        assert self.model is not None
        gen = torch.Generator(device=self.model.device).manual_seed(req.request.seed)
        max_tokens = p.max_tokens or DEFAULT_MAX_TOKENS
        return Sampling(
            temperature=DEFAULT_TEMPERATURE if p.temperature is None else p.temperature,
            top_k=DEFAULT_TOP_K if p.top_k is None else p.top_k,
            top_p=1.0 if p.top_p is None else p.top_p,
            repetition_penalty=(
                DEFAULT_REPETITION_PENALTY if p.repetition_penalty is None else p.repetition_penalty
            ),
            min_tokens=min(p.min_tokens or 0, max_tokens),
            generator=gen,
        )

    def _speaker(self, req: _Request) -> int:
        assert self.model is not None
        voice = req.request.params.voice or self.args.voice
        if not voice or voice == "default":
            return next(iter(self.model.layout.speakers.values()))
        return self.model.speaker_id(voice)

    def _conditioning(self, req: _Request) -> Conditioning | None:
        """The request's prefill; None: nothing to speak."""
        import torch

        model = self.model
        assert model is not None and req.prompt_ids is not None
        usable = self._usable(req)
        if not usable:
            # The thinker's answer was one token or none (its end, or
            # max_tokens 1): the reference has no text position to build
            # the prefill from (its own generate raises there).  Nothing to
            # speak: the stage ends with no frames.
            return None
        hidden = None if req.media_hidden is None else torch.as_tensor(req.media_hidden)
        return model.conditioning(
            req.prompt_ids,
            usable[0] if usable else None,
            self._speaker(req),
            hidden,
            _media_info(req.grids),
        )

    def _prefill(
        self, reqs: list[_Request]
    ) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        """Start ``reqs``: static decoding prefills them in one forward
        (``TalkerModel.prefill_many``: one eager forward a request cost more
        host time than the steps of a batch that starts together); eager
        decoding one by one, its codes those of transformers' own prefill.
        A request whose prefill fails ends with the error, the rest go on."""
        model = self.model
        assert model is not None
        out: list[tuple[_Request, EngineOutput | BaseException | None]] = []
        ready: list[tuple[_Request, Conditioning]] = []
        for req in reqs:
            try:
                cond = self._conditioning(req)
            except Exception as exc:
                out += self._prefill_failed([req], exc)
                continue
            if cond is None:
                out += self._finish(req, "stop")
            else:
                ready.append((req, cond))
        groups = [ready] if self._graphs is not None else [[r] for r in ready]
        for group in filter(None, groups):
            try:
                started = model.prefill_many(
                    [cond for _, cond in group], [self._sampling(req) for req, _ in group]
                )
            except Exception as exc:
                out += self._prefill_failed([req for req, _ in group], exc)
                continue
            for (req, cond), (cache, slot, code, hidden) in zip(group, started, strict=True):
                req.cache, req.slot, req.code, req.hidden = cache, slot, code, hidden
                req.prefill_len = cond.embeds.shape[0]
                try:
                    out += self._prefilled(req)
                except Exception as exc:
                    out += self._prefill_failed([req], exc)
        return out

    def _prefill_failed(
        self, reqs: list[_Request], exc: Exception
    ) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        log.error("talker prefill failed for %s", ", ".join(r.rid for r in reqs), exc_info=exc)
        for req in reqs:
            self._forget(req)
        return [(req, exc) for req in reqs]

    def _prefilled(
        self, req: _Request
    ) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        """A request just prefilled: its first code checked, and under
        static decoding its delivered frames replayed and its slot taken."""
        if self._graphs is None:
            return self._after_code(req)
        if req.forced:
            self._replay_forced(req)
        out = self._after_code(req)
        if not out:
            self._join(req)
        return out

    # -- static decoding (TalkerGraphs) ---------------------------------------------

    def _replay_forced(self, req: _Request) -> None:
        """A continuation's delivered frames, replayed eagerly on its own
        cache before it takes a slot (as ``_step`` replays them in a batch)."""
        import torch

        from omnix.engines.talker_model import BatchCache

        model = self.model
        assert model is not None and req.slot is not None
        cache = BatchCache(model.talker.config.text_config)
        cache.add(req.cache, req.slot.length)
        while req.frames < len(req.forced):
            text = self._trailing(req, req.frames)
            assert text is not None  # _can_prefill waited for it
            frame = torch.tensor([req.forced[req.frames]])
            codes, hidden = model.forced_step(cache, [req.slot], frame, text[None])
            req.frames += 1
            req.code, req.hidden = codes[0], hidden[0]
            if req.frames < len(req.forced):
                req.code = req.forced[req.frames][0]
        req.cache, _ = cache.take(0)

    def _join(self, req: _Request) -> None:
        graphs = self._graphs
        assert graphs is not None and req.slot is not None
        s = req.slot
        req.row = graphs.join(
            req.cache, s.length, s.rope_delta, s.generated, req.code, req.hidden, s.sampling
        )
        req.cache = req.hidden = None
        self._rows[req.row] = req

    def _graph_step(self) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        """One step of every slotted request whose next text is in."""
        graphs = self._graphs
        assert graphs is not None
        out: list[tuple[_Request, EngineOutput | BaseException | None]] = []
        # A request whose slot is full ends before the step (which would
        # write its next position), leaving its slot to the last one.
        for req in [self._rows[row] for row in range(graphs.used)]:
            assert req.slot is not None
            if req.slot.length >= graphs.max_len:
                out += self._finish(req, "length")
        active: dict[int, Any] = {}
        stepping: list[_Request] = []
        for row in range(graphs.used):
            req = self._rows[row]
            text = self._trailing(req, req.frames)
            if text is not None:
                active[row] = text
                stepping.append(req)
        if not active:
            return out
        result = graphs.step(active)
        for req, frame, code in zip(stepping, result.frames, result.codes, strict=True):
            assert req.slot is not None
            req.frames += 1
            req.slot.length += 1
            req.slot.generated.append(code)
            req.code = code
            piece = self._piece(req, req.frames - 1)
            out.append((req, EngineOutput(modality="codec", token_ids=tuple(frame), piece=piece)))
            out += self._after_code(req)
        return out

    def _regroup(self) -> None:
        """Rows whose next text vector is unknown leave the batch (keeping
        their cache); set-aside rows whose text came rejoin it."""
        assert self._cache is not None
        for i in reversed(range(len(self._batch))):
            req = self._batch[i]
            if self._trailing(req, req.frames) is None:
                req.cache, _ = self._cache.take(i)
                self._batch.pop(i)
        # A copy: the event loop's thread adds requests while this runs on
        # the engine's, and iterating the dict itself raises "dictionary
        # changed size during iteration" when one comes in mid-regroup.
        for req in list(self._reqs.values()):
            if (
                req.slot is not None
                and req.cache is not None
                and not req.finished
                and self._trailing(req, req.frames) is not None
            ):
                self._cache.add(req.cache, req.slot.length)
                req.cache = None
                self._batch.append(req)

    def _step(self) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        import torch

        model, cache = self.model, self._cache
        assert model is not None and cache is not None
        batch = list(self._batch)
        slots = [r.slot for r in batch]
        assert all(s is not None for s in slots)
        text = torch.stack([self._trailing(r, r.frames) for r in batch])  # type: ignore[misc]
        forced = [r for r in batch if r.frames < len(r.forced)]
        if forced and len(forced) == len(batch):
            frames = torch.tensor([r.forced[r.frames] for r in batch])
            codes, hidden = model.forced_step(cache, slots, frames, text)  # type: ignore[arg-type]
        else:
            if forced:
                # Replays step apart from the rest (no code predictor).
                normal = [r for r in batch if r not in forced]
                return self._step_without(normal) + self._step_without(forced)
            frames, codes, hidden = model.step(
                cache,
                slots,  # type: ignore[arg-type]
                [r.code for r in batch],
                torch.stack([r.hidden for r in batch]),
                text,
            )
        out: list[tuple[_Request, EngineOutput | BaseException | None]] = []
        for i, req in enumerate(batch):
            replay = req.frames < len(req.forced)
            req.frames += 1
            req.code, req.hidden = codes[i], hidden[i]
            if not replay:
                frame = tuple(frames[i].tolist())
                piece = self._piece(req, req.frames - 1)
                out.append((req, EngineOutput(modality="codec", token_ids=frame, piece=piece)))
            if replay and req.frames < len(req.forced):
                req.code = req.forced[req.frames][0]
            out += self._after_code(req)
        return out

    def _step_without(
        self, aside: list[_Request]
    ) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        assert self._cache is not None
        for req in aside:
            i = self._batch.index(req)
            req.cache, _ = self._cache.take(i)
            self._batch.pop(i)
        out = self._step() if self._batch else []
        for req in aside:
            assert req.slot is not None
            self._cache.add(req.cache, req.slot.length)
            req.cache = None
            self._batch.append(req)
        return out

    def _after_code(
        self, req: _Request
    ) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        """End the request if its newest first-group code ends it."""
        model = self.model
        assert model is not None and req.slot is not None
        max_tokens = req.request.params.max_tokens or DEFAULT_MAX_TOKENS
        replaying = req.frames < len(req.forced)
        if replaying:
            return []
        if req.code == model.layout.codec_eos:
            reason = "stop"
        elif len(req.slot.generated) >= max_tokens:
            reason = "length"
        else:
            return []
        return self._finish(req, reason)

    def _finish(
        self, req: _Request, reason: str
    ) -> list[tuple[_Request, EngineOutput | BaseException | None]]:
        self._forget(req)
        final = EngineOutput(
            modality="codec",
            finish_reason=reason,
            prompt_tokens=req.prefill_len,
            output_tokens=req.frames,
        )
        return [(req, final), (req, None)]


def _deliver(results: list[tuple[_Request, EngineOutput | BaseException | None]]) -> None:
    for req, out in results:
        req.queue.put_nowait(out)


def _media_info(g: MediaGrids) -> Any:
    import torch

    from omnix.engines.talker_model import MediaInfo

    def tensor(rows: tuple[Any, ...], dtype: Any = torch.long) -> torch.Tensor | None:
        return torch.tensor(rows, dtype=dtype) if rows else None

    # vLLM's Qwen3-Omni places a video's frames 2 s per temporal patch apart
    # when its processor said nothing (its mrope positions' default).
    per_grid = g.video_second_per_grid or (2.0,) * len(g.video_grid_thw)
    return MediaInfo(
        image_grid_thw=tensor(g.image_grid_thw),
        video_grid_thw=tensor(g.video_grid_thw),
        audio_seqlens=tensor(g.audio_seqlens),
        second_per_grids=tensor(per_grid, torch.float32),
        # Not ``g.use_audio_in_video``: transformers' generate hands its
        # talker the grids and seconds per grid but not that flag (5.19),
        # so the reference places a video's sound as the positions of
        # the interleaved prompt say without it; this talker equals it.
        use_audio_in_video=False,
    )
