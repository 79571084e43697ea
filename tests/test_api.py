"""The offline API end to end through real worker processes (scripted
engines): submit, stream, collect, the sync wrapper, and shutdown order."""

from __future__ import annotations

import os

import pytest

from omnix.api import NotReady, Omni, OmniSync, Overloaded, ShuttingDown
from omnix.events.types import (
    TERMINAL_TYPES,
    Cancelled,
    Chunk,
    Rejected,
    RequestSpec,
    WorkerJoined,
)
from omnix.pipelines.plan import RequestError
from omnix.pipelines.validate import parse_pipeline

from .orchestrator.conftest import OMNI_LIKE, omni_like


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes once reaped.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def test_generate_streams_text_and_audio_through_real_workers():
    async with Omni(parse_pipeline(OMNI_LIKE)) as omni:
        ev = omni.submit(RequestSpec(prompt="hi", outputs=("text", "audio"), seed=3))
        outs = [o async for o in omni.stream(ev.request_id)]
        assert {o.modality for o in outs} == {"text", "audio"}
        result = await omni.collect(ev.request_id)
        assert result.ok and result.text.startswith("t0 t1 ")
        assert result.audio is not None and result.audio.dtype.name == "float32"
        assert omni.sequencer.dropped == 0
        # The thinker's output streamed into the talker before it finished.
        evs = omni.log.events_for(ev.request_id)
        first_talker = min(e.pos for e in evs if isinstance(e, Chunk) and e.stage == "talker")
        thinker_done = max(e.pos for e in evs if isinstance(e, Chunk) and e.stage == "thinker")
        assert first_talker < thinker_done


async def test_invalid_request_appends_nothing():
    async with Omni(parse_pipeline(OMNI_LIKE)) as omni:
        before = len(omni.log)
        with pytest.raises(RequestError):
            omni.submit(RequestSpec(prompt="hi", outputs=("image",)))
        assert len(omni.log) == before


async def test_shutdown_cancels_what_does_not_finish_in_the_grace_period():
    cfg = omni_like(talker='engine = { kind = "scripted", output_modality = "codec", hang_at = 1 }')
    omni = Omni(cfg)
    await omni.start()
    pids = [e.pid for e in omni.log.read() if isinstance(e, WorkerJoined)]
    ev = omni.submit(RequestSpec(prompt="hi", outputs=("text", "audio")))
    await omni.shutdown(grace_s=0.5)
    end = [e for e in omni.log.events_for(ev.request_id) if isinstance(e, TERMINAL_TYPES)]
    assert len(end) == 1 and isinstance(end[0], Cancelled) and end[0].reason == "shutdown"
    with pytest.raises(ShuttingDown):
        omni.submit(RequestSpec(prompt="late"))
    await omni.shutdown()  # idempotent
    assert pids and not any(_alive(p) for p in pids)


async def test_generate_raises_overloaded_with_the_recorded_rejection():
    cfg = omni_like(
        thinker='max_queue = 0\nengine = { kind = "scripted", capacity = 1, hang_at = 0 }'
    )
    async with Omni(cfg) as omni:
        omni.submit(RequestSpec(prompt="a"))
        with pytest.raises(Overloaded) as err:
            await omni.generate(RequestSpec(prompt="b"))
        assert err.value.event.reason == "overloaded"


def test_sync_wrapper_generates_in_order():
    with OmniSync(parse_pipeline(OMNI_LIKE)) as omni:
        results = omni.generate(
            ["a", "b"], sampling_params_list={"thinker": {"max_tokens": 3}}, seed=1
        )
    assert [r.text for r in results] == ["t0 t1 t2 ", "t0 t1 t2 "]
    assert all(r.ok for r in results)


async def test_a_credit_held_by_a_failed_request_is_waited_for_not_exceeded():
    # thinker has one credit.  r1 fails at the talker while the thinker still
    # runs it; the orchestrator frees r1's credit at Failed and routes r2 at
    # once, but the worker still holds r1 until it acknowledges the abort.
    # The runtime holds r2 back until then: never more than capacity.
    cfg = omni_like(
        thinker='engine = { kind = "scripted", capacity = 1, chunks_per_piece = 40, delay_ms = 5 }',
        talker='engine = { kind = "scripted", output_modality = "codec", fail_at = 0 }',
    )
    async with Omni(cfg) as omni:
        r1 = omni.submit(RequestSpec(prompt="a", outputs=("text", "audio")))
        r2 = omni.submit(RequestSpec(prompt="b", outputs=("text",)))
        res1 = await omni.collect(r1.request_id)
        res2 = await omni.collect(r2.request_id)
        assert res1.status == "failed" and res1.reason == "stage_error"
        assert res2.ok and res2.text.startswith("t0 ")


async def test_a_log_taken_over_keeps_the_rules_it_was_written_under(tmp_path):
    from omnix.orchestrator.decide import RULES_VERSION
    from omnix.testing.serving import InProcessRuntime

    cfg = omni_like()
    spec = RequestSpec(prompt="hi", outputs=("text",))
    async with Omni(cfg, log_dir=tmp_path, runtime_factory=InProcessRuntime) as omni:
        assert omni.rules == RULES_VERSION
        assert (await omni.collect(omni.submit(spec).request_id)).ok
    # As a server of rules v1 would have left it.
    (tmp_path / "server.json").write_text(
        '{"omnix_version": "0.1.0", "schema_version": 1, "rules_version": 1}'
    )
    async with Omni(cfg, log_dir=tmp_path, runtime_factory=InProcessRuntime) as again:
        assert again.rules == 1 and again.orchestrator.rules == 1
        assert again.recovered_events > 0
        assert (await again.collect(again.submit(spec).request_id)).ok
    assert '"rules_version":1' in (tmp_path / "server.json").read_text()
    # A new log directory decides under the current rules.
    fresh = Omni(cfg, log_dir=tmp_path / "new", runtime_factory=InProcessRuntime)
    assert fresh.rules == RULES_VERSION
    fresh.log.close()


class _JoinsLater:
    """A runtime whose replicas join when the test says (``join``), as
    workers started by hand or shared with another ``Omni`` do."""

    def __init__(self, pipeline, emit, blobs):
        from omnix.testing.serving import InProcessRuntime

        self.inner = InProcessRuntime(pipeline, self._join_only_when_asked, blobs)
        self.emit = emit
        self.held: list[WorkerJoined] = []

    def _join_only_when_asked(self, ev):
        if isinstance(ev, WorkerJoined):
            self.held.append(ev)
        else:
            self.emit(ev)

    def join(self, stage: str) -> None:
        for ev in [e for e in self.held if e.stage == stage]:
            self.held.remove(ev)
            self.emit(ev)

    async def start(self):
        await self.inner.start()

    async def shutdown(self):
        await self.inner.shutdown()

    def send(self, work):
        self.inner.send(work)

    def abort(self, request_id, stage, replica):
        self.inner.abort(request_id, stage, replica)

    def release(self, request_id):
        self.inner.release(request_id)


async def test_wait_ready_returns_once_every_stage_has_a_ready_replica():
    import asyncio

    omni = Omni(omni_like(), runtime_factory=_JoinsLater)
    rt = omni.runtime
    assert isinstance(rt, _JoinsLater)
    await omni.start()
    try:
        spec = RequestSpec(prompt="hi", outputs=("text", "audio"))
        assert isinstance(omni.submit(spec), Rejected)  # nothing joined: not_ready
        waiting = asyncio.ensure_future(omni.wait_ready(5))
        rt.join("thinker")
        rt.join("talker")
        await asyncio.sleep(0)
        assert not waiting.done()  # code2wav has not joined
        rt.join("code2wav")
        assert await waiting == {"thinker": 1, "talker": 1, "code2wav": 1}
        assert (await omni.collect(omni.submit(spec).request_id)).ok
    finally:
        await omni.shutdown()


async def test_wait_ready_names_the_stages_it_timed_out_on():
    omni = Omni(omni_like(), runtime_factory=_JoinsLater)
    rt = omni.runtime
    assert isinstance(rt, _JoinsLater)
    await omni.start()
    try:
        rt.join("thinker")
        with pytest.raises(NotReady, match=r"'talker' 0 of 1, 'code2wav' 0 of 1"):
            await omni.wait_ready(0.05)
        with pytest.raises(TimeoutError):  # NotReady is one
            await omni.wait_ready(0.01)
    finally:
        await omni.shutdown()


async def test_wait_ready_every_replica_waits_for_all_of_them():
    from omnix.testing.serving import InProcessRuntime

    cfg = omni_like(thinker="replicas = 2")
    async with Omni(cfg, runtime_factory=InProcessRuntime) as omni:
        ready = await omni.wait_ready(5, every_replica=True)
        assert ready["thinker"] == 2


async def test_replicas_that_joined_before_start_stay_ready():
    """Workers started before ``Omni.start`` (shared by two ``Omni``, as
    ``omnix bench engines`` does) join through the sequencer: ``start`` does
    not take them for an earlier process's and record them lost."""
    from omnix.testing.serving import InProcessRuntime

    inner: list[InProcessRuntime] = []

    def factory(pipeline, emit, blobs):
        inner.append(InProcessRuntime(pipeline, emit, blobs))
        return _StartedElsewhere(inner[-1])

    omni = Omni(omni_like(), runtime_factory=factory)
    await inner[0].start()  # the workers join before the Omni starts
    await omni.start()
    try:
        assert await omni.wait_ready(5) == {"thinker": 1, "talker": 1, "code2wav": 1}
        assert omni.recovered_events == 0
        spec = RequestSpec(prompt="hi", outputs=("text", "audio"))
        assert (await omni.collect(omni.submit(spec).request_id)).ok
    finally:
        await omni.shutdown()
        await inner[0].shutdown()


class _StartedElsewhere:
    def __init__(self, rt):
        self.rt = rt

    async def start(self):
        pass

    async def shutdown(self):
        pass

    def send(self, work):
        self.rt.send(work)

    def abort(self, request_id, stage, replica):
        self.rt.abort(request_id, stage, replica)

    def release(self, request_id):
        self.rt.release(request_id)


async def test_a_standby_takes_over_a_followed_log_with_its_workers_already_joined():
    from omnix.events.log import MemoryLog
    from omnix.events.types import Chunk, WorkerLost
    from omnix.testing.serving import InProcessRuntime

    cfg = omni_like(thinker='engine = { kind = "scripted", chunks_per_piece = 30, delay_ms = 10 }')
    spec = RequestSpec(prompt="hi", outputs=("text", "audio"))
    async with Omni(cfg, runtime_factory=InProcessRuntime) as alone:
        undisturbed = await alone.collect(alone.submit(spec, "r").request_id)
    assert undisturbed.ok

    leader = Omni(cfg, runtime_factory=InProcessRuntime)
    await leader.start()
    leader.submit(spec, "r")
    async for ev in leader.events("r"):
        if isinstance(ev, Chunk) and ev.stage == "thinker" and ev.index == 5:
            break
    # What a standby had folded when the leader died: its log, to here.
    followed = MemoryLog(events=leader.log.read())
    held_from = len(followed)
    await leader.runtime.shutdown()  # the leader's workers die with it

    standby = Omni(cfg, log=followed, runtime_factory=InProcessRuntime, standby=True)
    await standby.warm()
    assert len(followed) == held_from  # its workers' joins are held, not appended
    assert standby.retention is None  # a standby decides nothing, releases included
    await standby.start()
    result = await standby.collect("r")
    await standby.shutdown()
    assert result.ok and result.text == undisturbed.text
    assert result.audio is not None and undisturbed.audio is not None
    assert result.audio.tobytes() == undisturbed.audio.tobytes()
    after = list(followed.read(held_from))
    lost = [i for i, ev in enumerate(after) if isinstance(ev, WorkerLost)]
    joined = [i for i, ev in enumerate(after) if isinstance(ev, WorkerJoined)]
    assert lost and joined and max(lost) < min(joined)  # the old replicas go first
    assert standby.retention is not None
