"""Hypothesis strategies for event logs: plausible request lifecycles,
random interleavings and injected illegal events.

Owns: a small model of *plausible* request behaviour (a subset of what the
reducer allows: a client admits, the orchestrator routes the stages in
order, workers start, stream contiguous chunks, finish or fail, a cancel
drains the active stages first) used to generate streams, plus injections
whose legality the test decides from what was actually accepted.  Does not
own legality itself: the reducer is the oracle, this model only promises
that a request nothing was injected into is accepted end to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from omnix.events.types import (
    Admitted,
    Cancelled,
    CancelRequested,
    Chunk,
    DeadlineExpired,
    Event,
    Failed,
    Finished,
    Progress,
    Rejected,
    RequestSpec,
    Routed,
    StageFailed,
    StageFinished,
    StageStarted,
    WorkerJoined,
    WorkerLost,
)

STAGES = ("thinker", "talker", "code2wav")
MODALITY = {"thinker": "text", "talker": "codec", "code2wav": "audio"}
REPLICAS = (0, 1)
SPEC = RequestSpec(prompt="hi", outputs=("text", "audio"), seed=3)
TERMINAL = (Rejected, Cancelled, Failed, Finished)


def worker_joins() -> list[Event]:
    return [
        WorkerJoined(worker_id=f"{s}/{r}", stage=s, replica=r, engine="scripted", capacity=4)
        for s in STAGES
        for r in REPLICAS
    ]


@dataclass
class _Stage:
    replica: int
    pieces: int = 0
    closed: bool = False
    chunks: int = 0
    started: bool = False
    status: str = "routed"  # routed | running | finished | aborted | failed


@dataclass
class _Req:
    rid: str
    plan: tuple[str, ...]
    replicas: dict[str, int]
    admitted: bool = False
    terminal: bool = False
    cancelling: bool = False
    stages: dict[str, _Stage] = field(default_factory=dict)

    def actions(self) -> list[str]:
        if self.terminal:
            return []
        if not self.admitted:
            return ["admit", "admit", "admit", "reject"]
        acts = ["halt", "deadline", "fail"]
        if not self.cancelling:
            acts.append("cancel")
        active = [n for n, s in self.stages.items() if s.status in ("routed", "running")]
        nxt = next((n for n in self.plan if n not in self.stages), None)
        if nxt is not None and not self.cancelling:
            k = self.plan.index(nxt)
            prev = self.stages.get(self.plan[k - 1]) if k else None
            if k == 0 or (prev is not None and (prev.chunks > 0 or prev.status == "finished")):
                acts += ["route", "route"]
        for n in active:
            s = self.stages[n]
            if self.cancelling:
                acts.append(f"abort_ack:{n}")
                continue
            if not s.closed:
                acts.append(f"piece:{n}")
            if not s.started:
                acts.append(f"start:{n}")
            acts += [f"chunk:{n}", f"chunk:{n}", f"chunk:{n}", f"progress:{n}"]
            if s.closed:
                acts += [f"finish:{n}", f"finish:{n}"]
            acts.append(f"stage_fail:{n}")
        if self.cancelling and not active:
            acts += ["cancelled", "cancelled"]
        if (
            not self.cancelling
            and not active
            and len(self.stages) == len(self.plan)
            and all(s.status == "finished" for s in self.stages.values())
        ):
            acts += ["finished"] * 4
        return acts

    def step(self, act: str, last: bool) -> Event | None:
        rid = self.rid
        name, _, stage = act.partition(":")
        if name == "admit":
            self.admitted = True
            return Admitted(request_id=rid, pipeline="sim", spec=SPEC)
        if name == "reject":
            self.admitted = self.terminal = True
            return Rejected(request_id=rid, pipeline="sim", spec=SPEC, reason="overloaded")
        if name == "halt":
            return None
        if name == "deadline":
            return DeadlineExpired(request_id=rid, scope="request")
        if name == "fail":
            self.terminal = True
            return Failed(request_id=rid, reason="stage_error", message="injected by the model")
        if name == "cancel":
            self.cancelling = True
            return CancelRequested(request_id=rid, reason="client")
        if name == "cancelled":
            self.terminal = True
            return Cancelled(request_id=rid, reason="client")
        if name == "finished":
            self.terminal = True
            return Finished(request_id=rid)
        if name == "route":
            stage = next(n for n in self.plan if n not in self.stages)
            closed = last or stage == self.plan[0]
            self.stages[stage] = _Stage(self.replicas[stage], pieces=1, closed=closed)
            return Routed(
                request_id=rid,
                stage=stage,
                replica=self.replicas[stage],
                seq=0,
                sources=(),
                last=closed,
            )
        s = self.stages[stage]
        r = s.replica
        if name == "piece":
            seq = s.pieces
            s.pieces += 1
            s.closed = last
            return Routed(request_id=rid, stage=stage, replica=r, seq=seq, sources=(), last=last)
        if name == "start":
            s.started = True
            s.status = "running"
            return StageStarted(request_id=rid, stage=stage, replica=r)
        if name == "chunk":
            s.status = "running"
            s.chunks += 1
            return Chunk(
                request_id=rid,
                stage=stage,
                replica=r,
                index=s.chunks - 1,
                modality=MODALITY[stage],
                text="x",
            )
        if name == "progress":
            s.status = "running"
            return Progress(request_id=rid, stage=stage, replica=r, step=s.chunks, total=99)
        if name == "finish":
            s.status = "finished"
            return StageFinished(request_id=rid, stage=stage, replica=r, chunks=s.chunks)
        if name == "abort_ack":
            s.status = "aborted"
            return StageFinished(
                request_id=rid, stage=stage, replica=r, chunks=s.chunks, finish_reason="aborted"
            )
        if name == "stage_fail":
            s.status = "failed"
            return StageFailed(request_id=rid, stage=stage, replica=r, message="boom")
        raise AssertionError(act)


@st.composite
def lifecycle(draw: st.DrawFn, rid: str, max_events: int = 24) -> list[Event]:
    """A plausible, legal sequence of events for one request."""
    plan = STAGES[: draw(st.integers(1, len(STAGES)))]
    replicas = {s: draw(st.sampled_from(REPLICAS)) for s in plan}
    req = _Req(rid, plan, replicas)
    out: list[Event] = []
    while len(out) < max_events:
        acts = req.actions()
        if not acts:
            break
        act = draw(st.sampled_from(acts))
        ev = req.step(act, last=draw(st.booleans()))
        if ev is None:
            break
        out.append(ev)
    return out


#: What an injected event is, and when the test may demand its refusal.
#: "illegal": refused whatever the state; the others are decided against
#: what the log actually accepted before it (see the property test).
INJECTIONS = (
    "ghost",  # an event for a request that was never admitted: illegal
    "bad_chunk",  # a chunk index no stage can expect: illegal
    "after_terminal",  # any event after the request's terminal one
    "readmit",  # a second Admitted for the same id
    "cancelled_early",  # Cancelled without a CancelRequested
    "worker_lost",  # legal; later events of that replica's requests may fail
    "rejoin",  # WorkerJoined for a worker that is alive
)


@dataclass(frozen=True)
class Step:
    ev: Event
    rid: str | None  # request it targets (None for worker events)
    kind: str  # "gen" for generated lifecycle events, else the injection


@st.composite
def event_streams(draw: st.DrawFn, *, inject: bool = True, max_requests: int = 6) -> list[Step]:
    """Worker joins, then several lifecycles interleaved at random, with
    illegal (or disruptive) events injected at random points."""
    n = draw(st.integers(1, max_requests))
    lives = [draw(lifecycle(f"r{i}")) for i in range(n)]
    steps = [Step(ev, None, "gen") for ev in worker_joins()]
    cursors = [0] * n
    remaining = sum(len(x) for x in lives)
    while remaining:
        choices = [i for i in range(n) if cursors[i] < len(lives[i])]
        i = draw(st.sampled_from(choices))
        steps.append(Step(lives[i][cursors[i]], f"r{i}", "gen"))
        cursors[i] += 1
        remaining -= 1
    if not inject:
        return steps
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(INJECTIONS))
        at = draw(st.integers(len(worker_joins()), len(steps)))
        target = f"r{draw(st.integers(0, n - 1))}"
        stage = draw(st.sampled_from(STAGES))
        replica = draw(st.sampled_from(REPLICAS))
        if kind == "ghost":
            ev: Event = Chunk(
                request_id="ghost", stage=stage, replica=replica, index=0, modality="text"
            )
            steps.insert(at, Step(ev, "ghost", kind))
        elif kind == "bad_chunk":
            ev = Chunk(
                request_id=target, stage=stage, replica=replica, index=10_000, modality="text"
            )
            steps.insert(at, Step(ev, target, kind))
        elif kind == "after_terminal":
            ev = draw(
                st.sampled_from(
                    [
                        Finished(request_id=target),
                        CancelRequested(request_id=target, reason="disconnect"),
                        DeadlineExpired(request_id=target, scope="request"),
                        Failed(request_id=target, reason="shutdown"),
                    ]
                )
            )
            steps.insert(at, Step(ev, target, kind))
        elif kind == "readmit":
            steps.insert(
                at, Step(Admitted(request_id=target, pipeline="sim", spec=SPEC), target, kind)
            )
        elif kind == "cancelled_early":
            steps.insert(at, Step(Cancelled(request_id=target, reason="client"), target, kind))
        elif kind == "worker_lost":
            ev = WorkerLost(
                worker_id=f"{stage}/{replica}", stage=stage, replica=replica, reason="killed"
            )
            steps.insert(at, Step(ev, None, kind))
        elif kind == "rejoin":
            ev = WorkerJoined(
                worker_id=f"{stage}/{replica}",
                stage=stage,
                replica=replica,
                engine="scripted",
                capacity=4,
            )
            steps.insert(at, Step(ev, None, kind))
    return steps
