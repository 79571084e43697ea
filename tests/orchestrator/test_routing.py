"""Routing along the pipeline graph: async chunk, fan-out/fan-in, ordering,
determinism.  All on the virtual-time simulator, so every run is exact."""

from __future__ import annotations

from omnix.events.codec import encode_event
from omnix.events.types import (
    TERMINAL_TYPES,
    Chunk,
    Finished,
    RequestSpec,
    Routed,
    StageFinished,
)
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.sim import start_sim

from .conftest import omni_like


def first_pos(events, cls, **match):
    for ev in events:
        if isinstance(ev, cls) and all(getattr(ev, k) == v for k, v in match.items()):
            return ev.pos
    raise AssertionError(f"no {cls.__name__} {match}")


async def test_downstream_stages_start_before_upstream_finishes(omni_cfg):
    omni, sim = await start_sim(omni_cfg)
    omni.submit(RequestSpec(prompt="hi", outputs=("text", "audio")), request_id="r1")
    sim.run_until_idle()
    events = list(omni.log.read())

    assert first_pos(events, Routed, stage="talker") < first_pos(
        events, StageFinished, stage="thinker"
    )
    assert first_pos(events, Routed, stage="code2wav") < first_pos(
        events, StageFinished, stage="talker"
    )
    # The first audio chunk exists before the thinker has finished its text.
    assert first_pos(events, Chunk, stage="code2wav") < first_pos(
        events, StageFinished, stage="thinker"
    )
    terminals = [ev for ev in events if isinstance(ev, TERMINAL_TYPES)]
    assert [type(t) for t in terminals] == [Finished]
    assert terminals[0] is events[-1]


async def test_outputs_arrive_in_order_and_complete(omni_cfg):
    omni, sim = await start_sim(omni_cfg)
    omni.submit(RequestSpec(prompt="hi", outputs=("text", "audio")), request_id="r1")
    sim.run_until_idle()
    outs = [o async for o in omni.stream("r1")]
    for modality in ("text", "audio"):
        idx = [o.index for o in outs if o.modality == modality]
        assert idx == list(range(len(idx))) and idx
    # Every chunk the talker made reached code2wav, in order, exactly once.
    events = list(omni.log.read())
    talker = [e.pos for e in events if isinstance(e, Chunk) and e.stage == "talker"]
    forwarded = [
        p for e in events if isinstance(e, Routed) and e.stage == "code2wav" for p in e.sources
    ]
    assert forwarded == talker
    result = await omni.collect("r1")
    assert result.ok and result.text.startswith("t0 t1 ") and result.audio is not None


async def test_text_only_request_runs_only_the_stages_it_needs(omni_cfg):
    omni, sim = await start_sim(omni_cfg)
    omni.submit(RequestSpec(prompt="hi", outputs=("text",)), request_id="r1")
    sim.run_until_idle()
    routed = {e.stage for e in omni.log.read() if isinstance(e, Routed)}
    assert routed == {"thinker"}
    assert omni.state("r1").status == "finished"


def _scenario_log(omni) -> bytes:
    return b"".join(encode_event(ev) for ev in omni.log.read())


async def _run_scenario() -> bytes:
    cfg = omni_like(talker="replicas = 2\nretry = true")
    omni, sim = await start_sim(cfg)
    for i in range(4):
        omni.submit(
            RequestSpec(
                prompt=f"p{i}", outputs=("text", "audio"), seed=i, deadline_ms=60 if i == 3 else 0
            ),
            request_id=f"r{i}",
        )
    for _ in range(40):
        sim.step()
    omni.cancel("r1")
    for _ in range(15):
        sim.step()
    sim.kill("talker", 0)
    sim.run_until_idle()
    return _scenario_log(omni)


async def test_same_scenario_twice_gives_byte_identical_logs():
    a = await _run_scenario()
    b = await _run_scenario()
    assert a == b and len(a) > 1000


FAN = """
name = "fan"
[[stages]]
name = "a"
engine = { kind = "scripted", chunks_per_piece = 4, delay_ms = 1 }
[[stages]]
name = "b"
engine = { kind = "scripted", chunks_per_piece = 2, delay_ms = 3 }
[[stages]]
name = "c"
engine = { kind = "scripted", chunks_per_piece = 1, delay_ms = 1, output_modality = "audio" }
[[stages]]
name = "d"
engine = { kind = "scripted", chunks_per_piece = 1, delay_ms = 1, output_modality = "image" }
[[edges]]
source = "a"
target = "b"
forward = "chunk"
every = 1
[[edges]]
source = "a"
target = "c"
forward = "chunk"
every = 2
[[edges]]
source = "b"
target = "d"
[[edges]]
source = "c"
target = "d"
[outputs]
text = "b"
audio = "c"
image = "d"
"""


async def test_fan_out_feeds_both_and_fan_in_waits_for_both():
    omni, sim = await start_sim(parse_pipeline(FAN))
    omni.submit(RequestSpec(prompt="x", outputs=("image",)), request_id="r1")
    sim.run_until_idle()
    events = list(omni.log.read())
    a_chunks = [e.pos for e in events if isinstance(e, Chunk) and e.stage == "a"]
    for target in ("b", "c"):
        got = [p for e in events if isinstance(e, Routed) and e.stage == target for p in e.sources]
        assert got == a_chunks
    d_routes = [e for e in events if isinstance(e, Routed) and e.stage == "d"]
    assert len(d_routes) == 1 and d_routes[0].last
    done_b = first_pos(events, StageFinished, stage="b")
    done_c = first_pos(events, StageFinished, stage="c")
    assert d_routes[0].pos > max(done_b, done_c)
    b_chunks = [e.pos for e in events if isinstance(e, Chunk) and e.stage == "b"]
    c_chunks = [e.pos for e in events if isinstance(e, Chunk) and e.stage == "c"]
    assert d_routes[0].sources == tuple(b_chunks + c_chunks)
    assert omni.state("r1").status == "finished"
