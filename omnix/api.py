"""The offline Python API: build a pipeline, submit requests, stream outputs.

Owns: ``Omni`` (async; what the HTTP layer adapts) and ``OmniSync`` (a small
blocking wrapper for scripts, like vLLM-Omni's ``Omni.generate``), and the
wiring of one server process: log, blob store, retention (its policy and
the once-a-second sweep of an idle server), orchestrator, sequencer,
dispatcher, timer and the stage runtime its ``RuntimeFactory`` builds.
Also ``Output``/``RequestResult``, the user-facing view of a request's
chunks.

Does not own any decision (the orchestrator), any worker (the runtime) or
any protocol (HTTP).  Everything a caller learns comes from the log: the
outputs of a request are its chunk events from the pipeline's output
stages, read back by tailing the log.

    async with Omni("tiny-text") as omni:
        result = await omni.generate(RequestSpec(prompt="hello"))
        print(result.text)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import msgspec
import numpy as np

from omnix.events.blobs import BlobStore, DiskBlobStore, MemoryBlobStore
from omnix.events.clock import Clock, SystemClock
from omnix.events.log import EventLog, LogClosed, MemoryLog
from omnix.events.reducer import RequestState
from omnix.events.retention import RequestStatusKind, Retention, RetentionPolicy
from omnix.events.transitions import IllegalTransition
from omnix.events.types import (
    TERMINAL_TYPES,
    Admitted,
    CancelReason,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    InputAppended,
    Modality,
    Rejected,
    Released,
    RequestSpec,
    Scaled,
    SessionChanged,
)
from omnix.orchestrator.capacity import group_rejections, room
from omnix.orchestrator.decide import RULES_VERSION, Orchestrator
from omnix.orchestrator.dispatch import Dispatcher
from omnix.orchestrator.gate import EmitGate
from omnix.orchestrator.recovery import recover_log, restart_inputs
from omnix.orchestrator.runtime import Runtime, RuntimeFactory
from omnix.orchestrator.scaling import Scaler, ScaleRefused, StageReplicas
from omnix.orchestrator.sequencer import Sequencer
from omnix.orchestrator.timers import DeadlineTimer
from omnix.pipelines.config import PipelineConfig
from omnix.pipelines.plan import PipelineGraph, RequestError, validate_request
from omnix.pipelines.validate import load_pipeline
from omnix.stages.options import RuntimeOptions
from omnix.transport.work import EngineInfo

if TYPE_CHECKING:
    from omnix.events.disklog import LogConfig
    from omnix.stages.runtime import ProfileReport

_T = TypeVar("_T")


class Overloaded(RuntimeError):
    """Admission was refused; ``event`` is the recorded ``Rejected``."""

    def __init__(self, event: Rejected) -> None:
        super().__init__(f"request refused ({event.reason}): {event.message}")
        self.event = event


class _ServerInfo(msgspec.Struct, frozen=True):
    """``DIR/server.json``: what wrote a log directory."""

    omnix_version: str = ""
    schema_version: int = 1
    rules_version: int = 1


class ShuttingDown(RuntimeError):
    pass


class NotReady(TimeoutError):
    """``Omni.wait_ready`` ran out of time; the message names the stages
    that still had too few ready replicas."""


class DuplicateRequestId(RequestError):
    """A request id already in use on this server (or twice in one group)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"request id {request_id!r} is already in use", "request_id", "duplicate_id"
        )
        self.request_id = request_id


class _Default:
    """``retention`` not given: on (``RetentionPolicy()``) for a log this
    ``Omni`` opens, off for a log handed in (its owner may retain it)."""


_DEFAULT = _Default()


class Output(msgspec.Struct):
    """One streamed piece of a request's final output."""

    modality: str
    stage: str
    index: int
    pos: int
    text: str = ""
    token_ids: tuple[int, ...] = ()
    array: np.ndarray | None = None
    data: bytes = b""
    media_type: str = ""


class RequestResult(msgspec.Struct):
    request_id: str
    status: str
    reason: str
    text: str
    token_ids: list[int]
    audio: np.ndarray | None
    images: list[bytes]
    state: RequestState

    @property
    def ok(self) -> bool:
        return self.status == "finished"


def new_request_id() -> str:
    return "req-" + secrets.token_hex(8)


def new_seed() -> int:
    return secrets.randbits(31)


class ProfilingOff(RuntimeError):
    """Profiling was asked of a server that does not profile."""


def _stage_runtime(options: RuntimeOptions | None) -> RuntimeFactory:
    """The default factory: a ``StageRuntime`` (worker processes) run as
    ``options`` say."""

    def build(pipeline: PipelineConfig, emit: Callable[[Event], None], blobs: BlobStore) -> Runtime:
        from omnix.stages.runtime import StageRuntime

        return StageRuntime(pipeline, emit=emit, blobs=blobs, options=options)

    return build


def _open_log_dir(
    log_dir: Path, pipeline: PipelineConfig, clock: Clock, config: LogConfig | None
) -> tuple[EventLog, int]:
    """The disk log in ``log_dir`` and the decision rules to run it under:
    those it was written with when it holds events (a log from before
    ``server.json`` said v1), else the current ones.  Records the pipeline
    and what writes the log beside it (replay drives a trace with the
    rules it was recorded under)."""
    from omnix import __version__
    from omnix.events.disklog import DiskLog
    from omnix.events.types import SCHEMA_VERSION

    log_dir.mkdir(parents=True, exist_ok=True)
    log = DiskLog(log_dir / "events", config, clock=clock)
    server = log_dir / "server.json"
    rules = RULES_VERSION
    if len(log) and server.is_file():
        rules = msgspec.json.decode(server.read_bytes(), type=_ServerInfo).rules_version
    (log_dir / "pipeline.json").write_bytes(msgspec.json.encode(pipeline))
    info = _ServerInfo(
        omnix_version=__version__, schema_version=SCHEMA_VERSION, rules_version=rules
    )
    server.write_bytes(msgspec.json.encode(info))
    return log, rules


def to_output(ev: Chunk, blobs: BlobStore) -> Output:
    """The user-facing view of one output chunk (its blob read back)."""
    array = None
    data = b""
    if ev.blob is not None:
        if ev.blob.dtype == "bytes":
            data = blobs.get(ev.blob)
        else:
            array = blobs.get_array(ev.blob)
    return Output(
        modality=ev.modality,
        stage=ev.stage,
        index=ev.index,
        pos=ev.pos,
        text=ev.text,
        token_ids=ev.token_ids,
        array=array,
        data=data,
        media_type=ev.blob.media_type if ev.blob is not None else "",
    )


def _takeover_inputs(
    log: EventLog,
    live: tuple[str, ...],
    unresumable: tuple[str, ...],
    oldest_ns: int,
    scaler: Scaler,
) -> Iterator[Event]:
    """The inputs that end or continue the requests a log taken over left
    in flight, each computed after the one before was appended (the
    caller emits them as they come): requests admitted before
    ``oldest_ns`` (the resume bound) or whose history was released end
    (``DeadlineExpired``), before the losses of the replicas the log still
    holds as joined, so they are not continued first; then the stages
    that scale go back to their ``min`` replicas (the runtime starts those)."""
    requests = log.state.requests
    for rid in live:
        if rid in unresumable:
            # Its history was released: ended, never continued on a guess.
            cancelling = requests[rid].status == "cancelling"
            yield DeadlineExpired(request_id=rid, scope="abort" if cancelling else "resume")
        elif requests[rid].admitted_ts < oldest_ns:
            yield DeadlineExpired(request_id=rid, scope="resume")
    yield from restart_inputs(log.state)
    yield from scaler.restart(log.state)


async def _sweep_loop(retention: Retention, log: EventLog, interval_s: float) -> None:
    """An idle server appends nothing, so retention's time bound would
    never be compared: read the log clock once a second (``sweep``)."""
    while not log.closed:
        await asyncio.sleep(interval_s)
        # Between awaits, so never inside a decision cascade.
        try:
            retention.sweep()
        except LogClosed:
            return


async def _scale_sweep(omni: Omni, interval_s: float) -> None:
    """An idle server appends no sample, so a stage would keep its extra
    replicas until traffic came back: ask the orchestrator every
    ``interval_s`` which drains are due by the log clock now, and append
    them (inputs, stamped with that reading: ``Scaler.idle``)."""
    log = omni.log
    while not log.closed:
        await asyncio.sleep(interval_s)
        # Between awaits, so never inside a decision cascade.
        for ev in omni.orchestrator.idle_scale(log.state, omni.clock.now_ns()):
            try:
                omni.sequencer.append(ev)
            except LogClosed:
                return


class _RetentionAndScalingTimers:
    """An idle server's own inputs, on timers: retention's sweep (every
    ``sweep_interval_s``) and the drains the clock makes due for stages
    that scale."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, omni: Omni) -> None:
        if omni.retention is not None and omni.sweep_interval_s > 0:
            sweep = _sweep_loop(omni.retention, omni.log, omni.sweep_interval_s)
            self._tasks.append(asyncio.create_task(sweep, name="omnix-retention"))
        scaling = [st.scaling for st in omni.pipeline.stages if st.scaling is not None]
        if scaling:
            every = max(0.05, min(1.0, min(r.down_after_s for r in scaling) / 4))
            drains = _scale_sweep(omni, every)
            self._tasks.append(asyncio.create_task(drains, name="omnix-scaling"))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _wait_ended(
    events: Callable[[str], AsyncIterator[Event]], rids: tuple[str, ...], limit_s: float
) -> None:
    """Until each of ``rids`` has its terminal event, or ``limit_s`` passed."""

    async def one(rid: str) -> None:
        async for _ in events(rid):
            pass

    try:
        await asyncio.wait_for(asyncio.gather(*(one(r) for r in rids)), limit_s)
    except TimeoutError:
        pass


def _not_ready(name: str, timeout: float | None, short: dict[str, tuple[int, int]]) -> str:
    have = ", ".join(f"{stage!r} {n} of {want}" for stage, (n, want) in short.items())
    return f"pipeline {name!r} not ready after {timeout:g} s: ready replicas of {have}"


def _short_stages(
    pipeline: PipelineConfig, orchestrator: Orchestrator, every_replica: bool
) -> dict[str, tuple[int, int]]:
    """Stages with fewer ready replicas than wanted (one, or ``every_replica``
    of them: of a stage that scales, those started and not draining), as
    the orchestrator sees the log: stage -> (ready, wanted)."""
    out = {}
    for st in pipeline.stages:
        # A stage that scales wants the replicas it holds now.
        held = len(orchestrator.scaler.members(st.name)) if st.scaling else st.min_replicas
        want = held if every_replica else 1
        have = orchestrator.ready_replicas(st.name)
        if have < want:
            out[st.name] = (have, want)
    return out


_E = TypeVar("_E", bound=Event)


def _stored(ev: Event, kind: type[_E]) -> _E:
    """The event the log stored, of the kind appended (the log returns what it stored)."""
    assert isinstance(ev, kind)
    return ev


async def request_events(log: EventLog, request_id: str, start: int = 0) -> AsyncIterator[Event]:
    """One request's events from log position ``start``, ending with its
    terminal event."""
    async for ev in log.tail(start, request_id=request_id):
        yield ev
        if isinstance(ev, TERMINAL_TYPES):
            return


def _engines(runtime: Runtime) -> list[tuple[str, int, EngineInfo]]:
    from omnix.stages.runtime import StageRuntime

    if not isinstance(runtime, StageRuntime):
        return []
    return [
        (stage, replica, EngineInfo(r.engine, r.capacity, r.device, r.model, r.settings))
        for stage, replica, r in runtime.engines()
    ]


async def _profile(
    runtime: Runtime, action: Literal["start", "stop"], stages: Sequence[str]
) -> list[ProfileReport]:
    from omnix.stages.runtime import RuntimeConfigError, StageRuntime

    if not isinstance(runtime, StageRuntime) or runtime.profile_dir is None:
        raise ProfilingOff(
            "profiling is off: start the server with --profile-dir DIR "
            "(omnix serve --profile-dir DIR) to enable /start_profile and /stop_profile"
        )
    try:
        return await runtime.profile(action, stages)
    except RuntimeConfigError as exc:
        raise ValueError(str(exc)) from exc


class Omni:
    """One pipeline served in this process, with its workers.

    ``runtime_factory`` builds the stage runtime, once, at construction
    (``omnix.orchestrator.runtime.RuntimeFactory``); by default a
    ``StageRuntime`` run as ``runtime_options`` say (``RuntimeOptions``),
    which spawns the pipeline's worker processes.  ``start`` starts the
    runtime, ``wait_ready`` waits until every stage can take work (call it
    before submitting right after ``start``), ``shutdown`` shuts it down.
    ``log_dir`` makes the log and blobs durable (``DIR/events``,
    ``DIR/blobs``, ``DIR/pipeline.json``).

    ``retention``: how long ended requests are kept (``RetentionPolicy``;
    ``None``: keep everything); not given, a log this ``Omni`` opens (or a
    standby's) gets ``RetentionPolicy()`` and a ``log`` handed in none.  Its
    ``Released`` events go through the sequencer; a task sweeps every
    ``sweep_interval_s`` so an idle server still lets requests go, and with
    a stage that scales, appends the drains its clock makes due
    (``Orchestrator.idle_scale``).
    ``log_config``: how a ``log_dir`` log writes (``LogConfig``: snapshots,
    ``archive=True`` to move released segments to ``DIR/events/archive``).

    ``standby``: ``log`` is followed while another server leads it
    (``omnix serve --standby``); ``warm`` starts the runtime meanwhile, its
    events held (``EmitGate``); ``start`` takes the log over as a restart does.

    ``virtual_time``: the clock moves only when the runtime moves it
    (``SimRuntime`` on a ``ManualClock``), so the deadline timer is not armed
    on the event loop; that runtime fires it (``timer.next_due``,
    ``timer.fire_due``).
    """

    def __init__(
        self,
        pipeline: PipelineConfig | str | os.PathLike[str],
        *,
        log_dir: str | os.PathLike[str] | None = None,
        log: EventLog | None = None,
        blobs: BlobStore | None = None,
        runtime_factory: RuntimeFactory | None = None,
        runtime_options: RuntimeOptions | None = None,
        clock: Clock | None = None,
        virtual_time: bool = False,
        resume_within_s: float = 300.0,
        retention: RetentionPolicy | _Default | None = _DEFAULT,
        log_config: LogConfig | None = None,
        sweep_interval_s: float = 1.0,
        standby: bool = False,
    ) -> None:
        if runtime_options is not None and not isinstance(runtime_options, RuntimeOptions):
            raise TypeError(
                "runtime_options must be a RuntimeOptions (omnix.stages.options), not "
                f"{type(runtime_options).__name__}"
            )
        if runtime_factory is not None and runtime_options is not None:
            raise ValueError(
                "runtime_options configure the default runtime; give them to runtime_factory instead"
            )
        self.pipeline = (
            pipeline
            if isinstance(pipeline, PipelineConfig)
            else load_pipeline(pipeline if isinstance(pipeline, str) else Path(pipeline))
        )
        self.graph = PipelineGraph(self.pipeline)
        self.clock = clock or SystemClock()
        self.log_dir = Path(log_dir) if log_dir is not None else None
        #: the decision rules this server decides under: the current ones,
        #: or those a log it takes over was written under (one log, one
        #: rules version, so replay re-derives every decision)
        self.rules = RULES_VERSION
        own_log = log is None
        if log is None:
            if self.log_dir is None:
                log = MemoryLog(self.clock)
            else:
                log, self.rules = _open_log_dir(self.log_dir, self.pipeline, self.clock, log_config)
        self.log = log
        #: the log held events before this ``Omni`` existed (an earlier
        #: process's, or one handed in): ``start`` rebuilds the orchestrator
        #: from them.  Events a runtime reports between construction and
        #: ``start`` (workers started beforehand, joining) went through the
        #: sequencer already and are not an earlier run's.
        self._taken_over = len(log) > 0  # a standby's is decided at start
        self.standby = standby
        if blobs is None:
            blobs = DiskBlobStore(self.log_dir / "blobs") if self.log_dir else MemoryBlobStore()
        self.blobs = blobs
        self.orchestrator = Orchestrator(self.pipeline, rules=self.rules)
        self.sequencer = Sequencer(self.log, self.orchestrator)
        #: what keeps a long-running server bounded (``None``: retention off)
        self.retention: Retention | None = None
        if isinstance(retention, _Default):
            retention = RetentionPolicy() if own_log or standby else None
        # A standby's retention attaches when it takes over: it decides
        # releases, and a standby decides nothing.
        self._retention_policy = retention
        if not standby:
            self._attach_retention()
        self.sweep_interval_s = sweep_interval_s
        self._sweeps = _RetentionAndScalingTimers()
        factory = runtime_factory or _stage_runtime(runtime_options)
        self._gate = EmitGate(self.sequencer.emit, held=standby)
        self.runtime: Runtime = factory(self.pipeline, self._gate, self.blobs)
        self._warmed = False
        self.dispatcher = Dispatcher(
            self.log,
            self.runtime,
            self.blobs,
            self.pipeline,
            report=self.sequencer.emit,
            wait_for_ack=self.log.acts_when_acknowledged,
        )
        self.timer = DeadlineTimer(self.sequencer, self.clock)
        self.virtual_time = virtual_time
        #: a log taken over: its requests admitted longer ago than this fail
        #: (``not_resumed``) instead of continuing
        self.resume_within_s = resume_within_s
        self._accepting = False
        self._started = False
        self._stopped = False
        #: events of an earlier process's log shown to the orchestrator at
        #: start, and the position it was shown from (not 0 once the log has
        #: a point where nothing was in flight: ``recovery.recover_log``)
        self.recovered_events = 0
        self.recovered_from = 0

    def _attach_retention(self) -> None:
        if self._retention_policy is not None:
            # Through the sequencer: a release decided while a cascade runs
            # is queued after it, and is an input like any other.
            self.retention = Retention(
                self.log, self._retention_policy, self.blobs, append=self.sequencer.append
            )

    # -- lifecycle ----------------------------------------------------------
    async def warm(self) -> None:
        """A standby's runtime starts before the server leads the log: its
        workers load and join, and what they report waits for ``start``."""
        if not self.standby or self._started or self._warmed:
            raise RuntimeError("warm() is for a standby Omni, once, before start()")
        self._warmed = True
        await self.runtime.start()

    async def start(self) -> Omni:
        if self._started:
            return self
        self._started = True
        if self.standby:
            self._taken_over = len(self.log) > 0
            self._attach_retention()
        resumed = self._taken_over
        unresumable: tuple[str, ...] = ()
        if resumed:
            # A log an earlier process wrote: its orchestrator's plans and
            # queues are rebuilt from the log before anything is appended
            # (from the last idle point before the requests in flight).
            recovered = recover_log(self.orchestrator, self.log)
            self.recovered_events = recovered.shown
            self.recovered_from = recovered.start
            unresumable = recovered.unresumable
        self.log.add_listener(self.dispatcher)
        self.timer.attach(None if self.virtual_time else asyncio.get_running_loop())
        if resumed:
            oldest = self.clock.now_ns() - int(self.resume_within_s * 1e9)
            live = self.orchestrator.live_requests
            scaler = self.orchestrator.scaler
            for ev in _takeover_inputs(self.log, live, unresumable, oldest, scaler):
                self.sequencer.emit(ev)
            for rid in self.orchestrator.live_requests:
                self.timer.track(rid)
        if not self._warmed:
            await self.runtime.start()
        self._gate.open()  # a standby's workers join now, after the old ones' losses
        if not self.virtual_time:
            self._sweeps.start(self)
        self._accepting = True
        return self

    async def wait_ready(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 (the bound its error names)
        *,
        every_replica: bool = False,
    ) -> dict[str, int]:
        """Return once every stage can take work: a ready replica per stage
        (``every_replica``: all it is configured with), as the log records
        them, which is what admission decides from.  Returns ``ready()``.

        Not part of ``start``: workers started by hand join whenever they
        come while the server listens, and readiness comes and goes while
        serving (a replica dies and is restarted).  Code that submits right
        after ``start`` calls this first.  Raises
        ``NotReady`` (a ``TimeoutError``) naming the stages still short
        after ``timeout`` seconds, ``ShuttingDown`` if shutdown begins."""
        if not self._started:
            raise RuntimeError("wait_ready() before start(): start the pipeline first")
        try:
            async with asyncio.timeout(timeout):
                while _short_stages(self.pipeline, self.orchestrator, every_replica):
                    if self._stopped or self.log.closed:
                        raise ShuttingDown("shut down before every stage was ready")
                    await self.log.wait_for(self.log.next_pos)
        except TimeoutError:
            short = _short_stages(self.pipeline, self.orchestrator, every_replica)
            raise NotReady(_not_ready(self.pipeline.name, timeout, short)) from None
        return self.ready()

    async def __aenter__(self) -> Omni:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def shutdown(self, grace_s: float = 5.0) -> None:
        """Stop admitting; let in-flight requests finish for ``grace_s``;
        cancel the rest (reason ``shutdown``) and wait for their terminal
        events (bounded by the pipeline's abort timeout); stop the runtime."""
        if self._stopped:
            return
        self._stopped = True
        self._accepting = False
        await self._sweeps.stop()  # no release nor drain decided while shutting down
        live = self.orchestrator.live_requests
        if live:
            await _wait_ended(self.events, live, grace_s)
        live = self.orchestrator.live_requests
        for rid in live:
            self.cancel(rid, "shutdown")
        if live:
            await _wait_ended(self.events, live, self.pipeline.abort_timeout_s + 1.0)
        self.timer.close()
        await self.runtime.shutdown()
        if self.retention is not None:
            self.retention.close()
        self.log.close()

    # -- requests -------------------------------------------------------------
    @property
    def accepting(self) -> bool:
        return self._accepting

    def ready(self) -> dict[str, int]:
        """Ready replicas per stage (as the log records them)."""
        return {n: self.orchestrator.ready_replicas(n) for n in self.graph.stage_names}

    def submit(self, spec: RequestSpec, request_id: str | None = None) -> Admitted | Rejected:
        """Validate and admit ``spec``.  Raises ``RequestError`` for a bad
        request (nothing is appended) and ``ShuttingDown`` after shutdown
        began; returns the appended ``Admitted`` or ``Rejected``."""
        (ev,) = self.submit_group(((request_id or new_request_id(), spec),))
        return ev

    def submit_group(
        self,
        members: Sequence[tuple[str, RequestSpec]],
        media: Sequence[tuple[np.ndarray, str]] = (),
    ) -> list[Admitted | Rejected]:
        """Admit every member (request id, spec) of one call, or none: the
        one place a request is judged.  Raises ``DuplicateRequestId``,
        ``RequestError`` (nothing appended or stored) or ``ShuttingDown``.
        Then ``media`` (arrays the specs' media parts reference) are stored
        and the members admitted: their ``Admitted`` events; or one
        ``Rejected`` per member of a group that does not fit whole now
        (``room``), or the one refusal that ended the group (its members
        admitted before it are cancelled)."""
        if not self._accepting:
            raise ShuttingDown("the server is not accepting requests")
        taken: set[str] = set()
        for rid, _ in members:
            if rid in self.log.state.requests or rid in taken:
                raise DuplicateRequestId(rid)
            taken.add(rid)
        # Every member first: a bad one must not leave its siblings admitted.
        for _, spec in members:
            validate_request(self.graph, spec)
        if len(members) > 1:
            workers = self.log.state.workers.values()
            refused = group_rejections(self.orchestrator, self.graph, workers, members)
            if refused:  # refused whole: one Rejected per member, nothing admitted
                return [_stored(self.sequencer.append(ev), Rejected) for ev in refused]
        for array, media_type in media:
            self.blobs.put_array(array, media_type)
        out: list[Admitted | Rejected] = []
        for rid, spec in members:
            ev = self.sequencer.submit(rid, spec)
            if isinstance(ev, Rejected):
                # Only if ``room`` misjudged: the group must not half run.
                for admitted in out:
                    self.cancel(admitted.request_id, "client")
                return [ev]
            out.append(ev)
        return out

    async def admit(
        self,
        members: Sequence[tuple[str, RequestSpec]],
        media: Sequence[tuple[np.ndarray, str]] = (),
    ) -> list[Admitted | Rejected]:
        """``submit_group`` as the HTTP layer calls it (a frontend's goes to the leader)."""
        return self.submit_group(members, media)

    def room(self, outputs: tuple[Modality, ...]) -> int:
        """How many requests for ``outputs`` admission would take now, one
        after the other (``omnix.orchestrator.capacity.room``)."""
        return room(self.orchestrator, self.graph, self.log.state.workers.values(), outputs)

    def scale(self, stage: str, count: int) -> list[Scaled]:
        """Set ``stage``'s replica count by hand (``POST
        /admin/stages/{name}/replicas``): the lowest free replicas start or
        the highest drain, each a ``Scaled`` input (``reason="admin"``);
        the stage keeps scaling by its rules from there.  Returns the
        appended events (none when it has ``count`` already).  Raises
        ``ScaleRefused``: an unknown stage, a fixed count, a count outside
        the stage's ``min..max``, replicas still draining in the way."""
        if stage not in self.graph.stage_names:
            raise ScaleRefused(
                404,
                "unknown_stage",
                f"pipeline {self.pipeline.name!r} has no stage {stage!r} "
                f"(stages: {', '.join(self.graph.stage_names)})",
            )
        planned = self.orchestrator.scaler.plan(stage, count)
        return [_stored(self.sequencer.append(ev), Scaled) for ev in planned]

    async def set_replicas(self, stage: str, count: int) -> StageReplicas:
        """``scale`` as the HTTP layer calls it: the stage's replicas after it."""
        scaled = [ev.pos for ev in self.scale(stage, count)]
        orch = self.orchestrator
        return orch.scaler.replicas(stage, orch.ready_replicas(stage), scaled)

    def cancel(self, request_id: str, reason: CancelReason = "client") -> bool:
        """Ask to cancel; False when the request is unknown or already over."""
        rs = self.log.state.requests.get(request_id)
        if rs is None or rs.terminal:
            return False
        self.sequencer.emit(CancelRequested(request_id=request_id, reason=reason))
        return True

    def delete(self, request_id: str) -> bool:
        """Release an ended request now, as its client deleted it (its
        events, blobs and state go, as retention's release does: a
        ``Released(reason="deleted")``).  False when it is unknown, in
        flight, or already released."""
        rs = self.log.state.requests.get(request_id)
        if rs is None or not rs.terminal:
            return False
        if self.retention is not None:
            return self.retention.delete((request_id,)) is not None
        self.log.before_release()
        self.sequencer.append(
            Released(request_ids=(request_id,), reason="deleted", ts_ns=self.log.clock.now_ns())
        )
        return True

    def append_input(
        self,
        request_id: str,
        text: str = "",
        last: bool = False,
        audio: np.ndarray | None = None,
    ) -> bool:
        """More input for a running request whose input streams
        (``RequestSpec.input_streams``): its source stages' next piece,
        ``text`` or an ``audio`` array (stored as a blob first: a duplex
        session's user frame); False when the request takes no more (it
        ended, or its last piece came)."""
        rs = self.log.state.requests.get(request_id)
        if rs is None or not rs.input_open:
            return False  # (before its audio is stored: a blob nothing would refer to)
        blob = None if audio is None else self.blobs.put_array(audio)
        ev = InputAppended(
            request_id=request_id,
            text=text,
            last=last,
            modality="text" if blob is None else "audio",
            blob=blob,
        )
        try:
            self.sequencer.append(ev)
        except IllegalTransition:
            return False
        return True

    def record(self, ev: SessionChanged) -> SessionChanged:
        """Append a realtime session's change (an input; it decides nothing)."""
        return _stored(self.sequencer.append(ev), SessionChanged)

    def state(self, request_id: str) -> RequestState | None:
        return self.log.state.requests.get(request_id)

    def request_status(self, request_id: str) -> RequestStatusKind:
        """``retained`` (its state and events are here), ``released`` (it
        ended before the retention window: its events are gone) or
        ``unknown``."""
        if self.retention is not None:
            return self.retention.status(request_id)
        return "retained" if request_id in self.log.state.requests else "unknown"

    def engines(self) -> list[tuple[str, int, EngineInfo]]:
        """(stage, replica, what its engine said of itself when it became
        ready) of every ready replica the runtime spawned or took in; empty
        for a runtime that does not run workers (the test runtimes)."""
        return _engines(self.runtime)

    async def profile(
        self, action: Literal["start", "stop"], stages: Sequence[str] = ()
    ) -> list[ProfileReport]:
        """Start or stop the profiler of every ready replica of ``stages``
        (all stages when empty); each replica's answer.  Raises
        ``ProfilingOff`` unless the runtime was given a ``profile_dir``
        (``omnix serve --profile-dir``), ``ValueError`` for a stage the
        pipeline does not have."""
        names = stages or [st.name for st in self.pipeline.stages]
        return await _profile(self.runtime, action, names)

    async def events(self, request_id: str, start: int = 0) -> AsyncIterator[Event]:
        """The request's events from log position ``start``, ending with its
        terminal event."""
        async for ev in request_events(self.log, request_id, start):
            yield ev

    def output_stages(self, spec: RequestSpec) -> dict[str, str]:
        """stage -> modality for the outputs the request asked for."""
        return {self.pipeline.outputs[m]: m for m in spec.outputs}

    def to_output(self, ev: Chunk) -> Output:
        return to_output(ev, self.blobs)

    async def stream(self, request_id: str) -> AsyncIterator[Output]:
        """Final outputs as they are produced; ends at the terminal event."""
        # The log's tail read directly (not through ``events``): this loop
        # runs once per streamed token per request, and every generator
        # layer costs a frame resume per event.
        wanted: dict[str, str] = {}
        async for ev in self.log.tail(0, request_id=request_id):
            if type(ev) is Chunk:
                if wanted.get(ev.stage) == ev.modality:
                    yield to_output(ev, self.blobs)
            elif type(ev) is Admitted:
                wanted = self.output_stages(ev.spec)
            elif type(ev) in TERMINAL_TYPES:
                return

    async def generate(self, spec: RequestSpec, request_id: str | None = None) -> RequestResult:
        """Submit and wait for the whole result.  Raises ``Overloaded``."""
        ev = self.submit(spec, request_id)
        if isinstance(ev, Rejected):
            raise Overloaded(ev)
        return await self.collect(ev.request_id)

    async def collect(self, request_id: str) -> RequestResult:
        """The request's whole result, once it ended."""
        return await _collect(request_id, self.stream(request_id), self.log.state.requests)


async def _collect(
    request_id: str, outputs: AsyncIterator[Output], requests: Mapping[str, RequestState]
) -> RequestResult:
    """A request's final outputs gathered into its ``RequestResult``."""
    text: list[str] = []
    ids: list[int] = []
    audio: list[np.ndarray] = []
    images: list[bytes] = []
    async for out in outputs:
        if out.modality == "text":
            text.append(out.text)
            ids.extend(out.token_ids)
        elif out.modality == "audio" and out.array is not None:
            audio.append(out.array)
        elif out.modality == "image":
            images.append(out.data)
    rs = requests[request_id]
    return RequestResult(
        request_id=request_id,
        status=rs.status,
        reason=rs.reason,
        text="".join(text),
        token_ids=ids,
        audio=np.concatenate(audio) if audio else None,
        images=images,
        state=rs,
    )


class OmniSync:
    """Blocking wrapper for scripts: an event loop in a background thread.

    ``generate`` takes prompts and returns results in order, like vLLM's
    ``LLM.generate``.  Use it as a context manager, or call ``close``.
    """

    def __init__(self, pipeline: PipelineConfig | str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="omnix-loop", daemon=True
        )
        self._thread.start()
        self.omni = Omni(pipeline, **kwargs)
        self._call(self.omni.start())

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def generate(
        self,
        prompts: str | list[str],
        *,
        outputs: tuple[Modality, ...] = ("text",),
        sampling_params_list: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> list[RequestResult]:
        from omnix.events.types import StageParams

        items = [prompts] if isinstance(prompts, str) else list(prompts)
        params = {
            k: v if isinstance(v, StageParams) else msgspec.convert(v, StageParams)
            for k, v in (sampling_params_list or {}).items()
        }

        async def run_all() -> list[RequestResult]:
            specs = [
                RequestSpec(
                    prompt=p,
                    outputs=outputs,
                    stage_params=params,
                    seed=new_seed() if seed is None else seed,
                    api="offline",
                )
                for p in items
            ]
            return list(await asyncio.gather(*(self.omni.generate(s) for s in specs)))

        return self._call(run_all())

    def close(self) -> None:
        if self._thread.is_alive():
            self._call(self.omni.shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def __enter__(self) -> OmniSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
