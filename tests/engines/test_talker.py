"""Qwen3-Omni's talker engine against transformers' generate: greedy codes
equal in every code group however the thinker's text arrives, several
requests decoding in one batch, a continuation after delivered frames,
aborts, voices.  No vLLM: the thinker's side is the reference's own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from omnix.events.types import StageParams
from omnix.models.paths import ModelPaths
from omnix.transport.work import GenerateRequest, InputPiece, Resume

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROMPTS = (("Say hello.", "chelsie"), ("Tell me about the sea.", "ethan"), ("Why?", "aiden"))
FRAMES = 40  # talker max_tokens: 39 frames unless it ends first


@pytest.fixture(scope="session")
def reference(tiny_models: ModelPaths):
    from omnix.testing.speech_oracle import Reference

    ref = Reference(Path(tiny_models.omni))
    return [
        ref.speak(text, speaker=voice, thinker_max_tokens=12, talker_max_tokens=FRAMES)
        for text, voice in PROMPTS
    ]


@pytest_asyncio.fixture(scope="session", loop_scope="session", params=["eager", "static"])
async def talker(tiny_models: ModelPaths, request) -> AsyncIterator:
    """The engine decoding eagerly, and over static slots (what CUDA graphs
    capture, run here without capture): every test holds for both."""
    from omnix.engines.talker_engine import TalkerEngine
    from omnix.pipelines.config import TalkerArgs

    engine = TalkerEngine(
        TalkerArgs(
            model=tiny_models.omni, max_batch=4, decode=request.param, graph_buckets=(1, 2, 4)
        )
    )
    await engine.start()
    yield engine
    await engine.close()


async def _pieces(prompt: list[int], text: list[int], every: int, pause: float = 0.0):
    yield InputPiece(modality="hidden", token_ids=tuple(prompt), text="{}")
    for i in range(0, len(text), every):
        if pause:
            await asyncio.sleep(pause)
        yield InputPiece(token_ids=tuple(text[i : i + every]))


def _request(rid: str, voice: str, resume: Resume | None = None, **kw) -> GenerateRequest:
    params = StageParams(temperature=0.0, max_tokens=FRAMES, voice=voice, **kw)
    return GenerateRequest(request_id=rid, stage="talker", params=params, resume=resume)


async def _frames(engine, request, inputs) -> tuple[np.ndarray, str]:
    frames, finish = [], ""
    async for out in engine.generate(request, inputs):
        if out.token_ids:
            frames.append(out.token_ids)
        finish = out.finish_reason or finish
    return np.asarray(frames, dtype=np.int64).reshape(-1, 16), finish


async def test_greedy_frames_equal_the_reference_in_a_batch_as_text_streams(
    talker, reference
) -> None:
    runs = [
        _frames(
            talker,
            _request(f"b{i}", voice),
            # Text in pieces of 1, 2 and 5 tokens, trickling: the talker
            # waits for each next token (or the end) before its frame.
            _pieces(want.prompt_ids, want.thinker_ids, every=(1, 2, 5)[i], pause=0.01),
        )
        for i, ((_, voice), want) in enumerate(zip(PROMPTS, reference, strict=True))
    ]
    got = await asyncio.gather(*runs)
    for (frames, finish), want in zip(got, reference, strict=True):
        np.testing.assert_array_equal(frames, want.codes)
        assert finish == ("length" if len(want.codes) == FRAMES - 1 else "stop")


async def test_a_continuation_replays_the_delivered_frames_and_goes_on(talker, reference) -> None:
    want = reference[1]
    k = len(want.codes) // 2
    delivered = tuple(int(c) for c in want.codes[:k].reshape(-1))
    resume = Resume(chunks=k + 1, token_ids=delivered)  # the context chunk, then k frames
    frames, _ = await _frames(
        talker,
        _request("cont", PROMPTS[1][1], resume),
        _pieces(want.prompt_ids, want.thinker_ids, every=3),
    )
    np.testing.assert_array_equal(frames, want.codes[k:])


async def test_an_aborted_request_stops_and_the_engine_serves_on(talker, reference) -> None:
    want = reference[0]
    got = []

    async def run() -> None:
        async for out in talker.generate(
            _request("ab", "chelsie"), _pieces(want.prompt_ids, want.thinker_ids, every=2)
        ):
            if out.token_ids:
                got.append(out)
                if len(got) == 3:
                    await talker.abort("ab")

    await asyncio.wait_for(run(), 60)
    assert len(got) == 3
    frames, _ = await _frames(
        talker, _request("after", "chelsie"), _pieces(want.prompt_ids, want.thinker_ids, every=4)
    )
    np.testing.assert_array_equal(frames, want.codes)


async def test_a_step_that_raises_fails_its_requests_and_the_engine_serves_on(
    talker, reference, monkeypatch
) -> None:
    """A decode step that raises (a fault injected into the model) fails
    the requests in the batch, never the engine's loop: the next request
    is served, equal to the reference."""
    want = reference[0]
    # The step of the engine's mode: the model's (eager) or the slots' (static).
    owner = talker.model if talker._graphs is None else talker._graphs
    real_step = owner.step
    calls = 0

    def fails_third(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("injected step fault")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(owner, "step", fails_third)
    runs = [
        _frames(talker, _request(f"f{i}", "chelsie"), _pieces(want.prompt_ids, want.thinker_ids, 4))
        for i in range(2)
    ]
    results = await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), 60)
    assert all(isinstance(r, RuntimeError) and "injected" in str(r) for r in results)
    monkeypatch.setattr(owner, "step", real_step)
    frames, _ = await asyncio.wait_for(
        _frames(talker, _request("g", "chelsie"), _pieces(want.prompt_ids, want.thinker_ids, 4)),
        60,
    )
    np.testing.assert_array_equal(frames, want.codes)


async def test_an_unknown_voice_fails_the_request_naming_the_known_ones(talker, reference) -> None:
    want = reference[0]
    with pytest.raises(ValueError, match="chelsie, ethan, aiden"):
        await _frames(
            talker, _request("v", "alloy"), _pieces(want.prompt_ids, want.thinker_ids, every=4)
        )


async def test_a_seeded_sampled_request_speaks_the_same_twice(talker, reference) -> None:
    want = reference[2]

    def sampled(rid: str) -> GenerateRequest:
        params = StageParams(temperature=0.9, top_k=50, max_tokens=FRAMES, voice="aiden")
        return GenerateRequest(request_id=rid, stage="talker", params=params, seed=5)

    a, _ = await _frames(talker, sampled("s1"), _pieces(want.prompt_ids, want.thinker_ids, 3))
    b, _ = await _frames(talker, sampled("s2"), _pieces(want.prompt_ids, want.thinker_ids, 1))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, want.codes[: len(a)])  # sampled, not greedy


async def test_a_checkpoint_without_talker_weights_says_so(
    tiny_models: ModelPaths, tmp_path: Path
) -> None:
    import json
    import shutil

    from omnix.engines.talker_model import TalkerModel

    mute = tmp_path / "mute"
    shutil.copytree(tiny_models.omni_thinker, mute)  # the thinker alone
    with pytest.raises(ValueError, match="enable_audio_output false: it has no talker"):
        TalkerModel.load(mute)
    cfg = json.loads((Path(tiny_models.omni) / "config.json").read_text())
    (mute / "config.json").write_text(json.dumps(cfg))  # says it speaks; holds no talker
    with pytest.raises(FileNotFoundError, match=r"holds no talker\.\* weights"):
        TalkerModel.load(mute)


@pytest.mark.parametrize("text", [[], "eos"], ids=["no token", "only its end"])
async def test_an_answer_of_at_most_one_token_ends_with_no_frames(talker, reference, text) -> None:
    """The reference's own generate raises here (no text position for the
    prefill); the talker ends the stage at once, with no audio to make."""
    want = reference[0]
    ids = [want.thinker_ids[-1]] if text == "eos" else []
    got = []
    async for out in talker.generate(
        _request("short", "chelsie"), _pieces(want.prompt_ids, ids, 1)
    ):
        got.append(out)
    assert [o.token_ids for o in got] == [()]
    assert got[-1].finish_reason == "stop" and got[-1].output_tokens == 0


def _ends_at_once(head, eos: int):
    """A codec head whose end of speech outscores every code: the talker
    would end each answer at its first choice."""
    import torch

    class EndsAtOnce(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = head

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            logits = self.head(hidden).clone()
            logits[..., eos] += 1e4
            return logits

    return EndsAtOnce()


@pytest.mark.parametrize("min_tokens", [0, 5])
async def test_min_tokens_holds_the_end_of_speech_back_that_many_frames(
    talker, reference, min_tokens
) -> None:
    want = reference[0]
    model = talker.model.talker
    head = model.codec_head
    model.codec_head = _ends_at_once(head, talker.model.layout.codec_eos)
    try:
        frames, finish = await _frames(
            talker,
            _request("min", "chelsie", min_tokens=min_tokens),
            _pieces(want.prompt_ids, want.thinker_ids, every=4),
        )
    finally:
        model.codec_head = head
    assert finish == "stop" and len(frames) == min_tokens


async def test_a_requests_generator_lives_on_the_models_device(talker) -> None:
    from omnix.engines.talker_engine import _Request

    params = StageParams(temperature=0.9, voice="aiden")
    req = _Request(
        "g", GenerateRequest(request_id="g", stage="talker", params=params), asyncio.Queue()
    )
    sampling = talker._sampling(req)
    assert sampling.generator.device == talker.model.device


async def test_graph_decoding_off_cuda_is_refused_in_one_line(tiny_models: ModelPaths) -> None:
    from omnix.engines.talker_engine import TalkerEngine
    from omnix.pipelines.config import TalkerArgs

    engine = TalkerEngine(TalkerArgs(model=tiny_models.omni, device="cpu", decode="graphs"))
    with pytest.raises(ValueError, match="needs a CUDA device, but the talker is on cpu"):
        await engine.start()
    await engine.close()
    engine = TalkerEngine(
        TalkerArgs(model=tiny_models.omni, decode="static", max_batch=8, graph_buckets=(1, 2))
    )
    with pytest.raises(ValueError, match="max_batch 8 is larger than its largest graph bucket 2"):
        await engine.start()
    await engine.close()


async def test_a_pipeline_asking_more_than_its_graph_buckets_is_refused() -> None:
    import msgspec

    from omnix.pipelines.validate import PipelineError, load_pipeline, validate_pipeline

    base = load_pipeline("tiny-omni")
    stages = tuple(
        msgspec.structs.replace(
            s, engine=msgspec.structs.replace(s.engine, max_batch=64, graph_buckets=(1, 4, 2))
        )
        if s.name == "talker"
        else s
        for s in base.stages
    )
    with pytest.raises(PipelineError, match=r"graph_buckets must be increasing sizes >= 1"):
        validate_pipeline(msgspec.structs.replace(base, stages=stages))


async def test_a_full_slot_ends_its_request_with_length_and_the_others_go_on(
    tiny_models: ModelPaths, reference
) -> None:
    """Static decoding holds max_len positions a request: one that fills its
    slot ends ("length") with the frames so far, equal to the reference's,
    and the requests beside it are not disturbed."""
    from omnix.engines.talker_engine import TalkerEngine
    from omnix.pipelines.config import TalkerArgs

    short, long_ = reference[2], reference[1]
    prefill = len(short.prompt_ids) + 30  # a bound on any tiny prompt's prefill here
    engine = TalkerEngine(
        TalkerArgs(
            model=tiny_models.omni,
            decode="static",
            max_batch=2,
            graph_buckets=(1, 2),
            max_len=prefill,
        )
    )
    await engine.start()
    try:
        (a, fin_a), (b, _) = await asyncio.gather(
            _frames(
                engine, _request("full", "aiden"), _pieces(short.prompt_ids, short.thinker_ids, 2)
            ),
            _frames(
                engine, _request("wide", "ethan"), _pieces(long_.prompt_ids, long_.thinker_ids, 3)
            ),
        )
    finally:
        await engine.close()
    assert fin_a == "length" and 0 < len(a) < len(short.codes)
    np.testing.assert_array_equal(a, short.codes[: len(a)])
    np.testing.assert_array_equal(b, long_.codes[: len(b)])


async def test_requests_prefilled_in_one_forward_start_as_each_alone(talker, reference) -> None:
    # Static decoding prefills the requests that start together in one
    # right-padded forward: each request's cache, first code and hidden
    # state are those of its own prefill.
    import torch

    from omnix.engines.talker_model import Sampling

    model = talker.model
    voices = [model.speaker_id(voice) for _, voice in PROMPTS]
    conds = [
        model.conditioning(want.prompt_ids, want.thinker_ids[0], voice)
        for want, voice in zip(reference, voices, strict=True)
    ]
    assert len({c.embeds.shape[0] for c in conds}) > 1  # padding is exercised
    together = model.prefill_many(conds, [Sampling() for _ in conds])
    for cond, (cache, slot, code, hidden) in zip(conds, together, strict=True):
        own_cache, own_slot, own_code, own_hidden = model.prefill(cond, Sampling())
        assert (code, slot.length, slot.rope_delta) == (
            own_code,
            own_slot.length,
            own_slot.rope_delta,
        )
        torch.testing.assert_close(hidden, own_hidden, rtol=0, atol=1e-5)
        for layer, own in zip(cache.layers, own_cache.layers, strict=True):
            torch.testing.assert_close(layer.keys, own.keys, rtol=0, atol=1e-5)
            torch.testing.assert_close(layer.values, own.values, rtol=0, atol=1e-5)
