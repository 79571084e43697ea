"""``Fold.apply_all`` (``omnix.events.fold_runs``) folds runs of chunks in
one step and equals ``apply``.

The property test covers random lifecycles; these pin the shapes a real
tiny-omni log has that random streams rarely produce: two stages of one
request streaming interleaved (async chunk forwarding), a stage whose
chunks change modality, and an error inside a run.
"""

from __future__ import annotations

import pytest

from omnix.events.reducer import Fold, IllegalTransition
from omnix.events.types import Admitted, Chunk, Event, Modality, RequestSpec, Routed, StageStarted


def _stamp(events: list[Event]) -> list[Event]:
    import msgspec

    return [msgspec.structs.replace(ev, pos=i, ts_ns=10_000 + 7 * i) for i, ev in enumerate(events)]


def _chunk(rid: str, stage: str, index: int, modality: Modality = "text") -> Chunk:
    return Chunk(request_id=rid, stage=stage, replica=0, index=index, modality=modality, text="x")


def _start(rid: str) -> list[Event]:
    return [
        Admitted(
            request_id=rid, pipeline="p", spec=RequestSpec(prompt="hi", outputs=("text", "audio"))
        ),
        Routed(request_id=rid, stage="thinker", replica=0, seq=0, sources=(), last=True),
        StageStarted(request_id=rid, stage="thinker", replica=0),
        Routed(request_id=rid, stage="talker", replica=0, seq=0, sources=(), last=True),
    ]


def _one_by_one(events: list[Event]) -> Fold:
    f = Fold()
    for ev in events:
        f.apply(ev)
    return f


def test_interleaved_stage_runs_fold_to_the_same_state() -> None:
    events = _start("a") + _start("b")
    made: dict[tuple[str, str], int] = {}
    for i in range(40):
        # thinker, talker, thinker, thinker, talker, ... across two requests
        rid = "ab"[i % 2]
        stage, modality = ("talker", "codec") if i % 5 in (1, 4) else ("thinker", "text")
        n = made[rid, stage] = made.get((rid, stage), -1) + 1
        events.append(_chunk(rid, stage, n, modality))
    events = _stamp(events)
    bulk = Fold()
    bulk.apply_all(events)
    one = _one_by_one(events)
    assert bulk.requests == one.requests
    assert bulk.next_pos == one.next_pos == len(events)
    # The last event of "b" was a thinker chunk after talker chunks: its
    # position, not the talker run's, is the request's last_pos.
    assert bulk.requests["b"].last_pos == events[-1].pos


def test_a_modality_change_inside_a_stage_folds_its_first_stamp() -> None:
    events = _stamp(
        [
            *_start("a"),
            _chunk("a", "thinker", 0),
            _chunk("a", "thinker", 1),
            _chunk("a", "thinker", 2, "audio"),
            _chunk("a", "thinker", 3, "audio"),
        ]
    )
    bulk = Fold()
    bulk.apply_all(events)
    assert bulk.requests == _one_by_one(events).requests
    assert bulk.requests["a"].first_audio_ts == events[-2].ts_ns


def test_an_illegal_chunk_inside_a_run_leaves_everything_before_it_folded() -> None:
    good = _stamp([*_start("a"), *(_chunk("a", "thinker", i) for i in range(5))])
    bad = _stamp([*good, _chunk("a", "thinker", 9)])
    bulk = Fold()
    with pytest.raises(IllegalTransition, match="chunk index 9 of stage 'thinker', expected 5"):
        bulk.apply_all(bad)
    assert bulk.requests == _one_by_one(good).requests
    assert bulk.next_pos == len(good)


def test_pieces_and_audio_chunks_alternating_fold_as_one_run() -> None:
    # code2wav as async chunk forwarding feeds it: a piece, an audio chunk,
    # a piece, ...; the audio samples add up from the blobs' shapes.
    from omnix.events.types import BlobRef

    def audio(i: int) -> Chunk:
        blob = BlobRef(digest=f"{i:032x}", nbytes=4 * 960, dtype="float32", shape=(960 + i,))
        return Chunk(
            request_id="a", stage="code2wav", replica=0, index=i, modality="audio", blob=blob
        )

    events: list[Event] = [
        *_start("a")[:3],
        Routed(request_id="a", stage="code2wav", replica=0, seq=0, sources=(), last=False),
        StageStarted(request_id="a", stage="code2wav", replica=0),
    ]
    for i in range(12):
        events.append(audio(i))
        events.append(_chunk("a", "thinker", i))
        events.append(
            Routed(request_id="a", stage="code2wav", replica=0, seq=i + 1, sources=(), last=i == 11)
        )
    events = _stamp(events)
    bulk = Fold()
    bulk.apply_all(events)
    one = _one_by_one(events)
    assert bulk.requests == one.requests
    assert bulk.audio_samples == one.audio_samples == {"a": sum(960 + i for i in range(12))}
    code2wav = bulk.requests["a"].stage("code2wav")
    assert code2wav is not None and code2wav.input_closed
