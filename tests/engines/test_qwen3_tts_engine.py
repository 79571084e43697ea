"""Qwen3-TTS's talker engine with its text streamed in: the codes of a
request whose input streams, sentence by sentence, equal the talker's own
streaming-text codes of the joined text (which tests/engines/test_qwen3_tts.py
holds equal to the reference's), in eager and static decoding, and its
first frame comes before its last sentence does; a request whose input
does not stream is spoken from its whole text as before.  On Base, the
talker clones with the speaker vector the request carries (its
``speaker`` part, what the server recorded), not one of its own from the
clip, and refuses a vector of another width."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from omnix.events.blobs import array_ref
from omnix.events.types import ChatMessage, MediaPart, StageParams
from omnix.models.paths import ModelPaths
from omnix.transport.work import GenerateRequest, InputPiece

FRAMES = 48
SENTENCES = ("Hello there.", "How are you today?", "I am fine, thank you.")
VOICE = "vivian"


@pytest.fixture(scope="module")
def folder(tiny_models: ModelPaths) -> Path:
    return Path(tiny_models.qwen3_tts_custom_voice)


@pytest.fixture(scope="module")
def expected(folder: Path) -> dict[bool, np.ndarray]:
    """The talker's own codes of the joined text: streaming-text mode
    (True) and whole-text mode (False)."""
    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker, SpeechRequest

    talker = Qwen3TTSTalker.load(folder)
    text = " ".join(SENTENCES)
    return {
        streams: talker.generate(
            SpeechRequest(text=text, speaker=VOICE, non_streaming=not streams),
            max_new_tokens=FRAMES,
        ).numpy()
        for streams in (True, False)
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["eager", "static"])
async def engine(folder: Path, request) -> AsyncIterator:
    from omnix.engines.qwen3_tts_engine import Qwen3TTSEngine
    from omnix.pipelines.config import Qwen3TTSTalkerArgs

    eng = Qwen3TTSEngine(
        Qwen3TTSTalkerArgs(
            model=str(folder), max_batch=2, decode=request.param, graph_buckets=(1, 2)
        )
    )
    await eng.start()
    yield eng
    await eng.close()


def _request(rid: str, streams: bool) -> GenerateRequest:
    params = StageParams(temperature=0.0, max_tokens=FRAMES, voice=VOICE)
    return GenerateRequest(rid, "talker", params, input_streams=streams)


@pytest.mark.asyncio(loop_scope="module")
async def test_streamed_sentences_speak_as_the_joined_text_in_streaming_mode(
    engine, expected
) -> None:
    first_frame = asyncio.Event()

    async def sentences() -> AsyncIterator[InputPiece]:
        yield InputPiece(text=SENTENCES[0])
        # The rest only once the first frame is out: the talker must not
        # wait for the whole text.
        await asyncio.wait_for(first_frame.wait(), 60)
        for s in SENTENCES[1:]:
            await asyncio.sleep(0.05)
            yield InputPiece(text=s)

    frames, pieces = [], []
    async for out in engine.generate(_request("streamed", True), sentences()):
        if out.token_ids:
            frames.append(out.token_ids)
            pieces.append(out.piece)
            first_frame.set()
    np.testing.assert_array_equal(np.asarray(frames).reshape(-1, 16), expected[True])
    # Each frame tells the sentence whose text it read: in order, all three.
    assert pieces == sorted(pieces) and set(pieces) == {0, 1, 2}


@pytest.mark.asyncio(loop_scope="module")
async def test_a_request_whose_input_does_not_stream_is_spoken_from_its_whole_text(
    engine, expected
) -> None:
    async def whole() -> AsyncIterator[InputPiece]:
        yield InputPiece(text=" ".join(SENTENCES))

    frames = [
        out.token_ids
        async for out in engine.generate(_request("whole", False), whole())
        if out.token_ids
    ]
    np.testing.assert_array_equal(np.asarray(frames).reshape(-1, 16), expected[False])


def test_the_dense_talker_has_no_experts_to_make_capturable(folder: Path) -> None:
    """Capturing CUDA graphs first switches an MoE talker's experts to a
    capturable kernel; Qwen3-TTS's talker is dense and has none, so the
    switch leaves it be (on the GPU it raised before the first graph)."""
    import torch

    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker
    from omnix.engines.talker_graphs import _capturable_experts

    talker = Qwen3TTSTalker.load(folder).talker
    _capturable_experts(talker, torch.bfloat16)


def test_pieces_join_with_a_space_but_none_after_a_wide_character() -> None:
    from omnix.engines.qwen3_tts_engine import _joined

    assert _joined("", "Hi.") == "Hi."
    assert _joined("Hi.", "How are you?") == "Hi. How are you?"
    assert _joined("Hi. ", "Bye.") == "Hi. Bye."
    assert _joined("你好。", "再见。") == "你好。再见。"


def test_prompts_prefilled_in_one_forward_start_as_each_alone(folder: Path) -> None:
    import torch

    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker, SpeechRequest
    from omnix.engines.talker_model import Sampling

    talker = Qwen3TTSTalker.load(folder)
    conds = [
        talker.prompt(SpeechRequest(text=text, speaker=VOICE)).prefill
        for text in (SENTENCES[0], " ".join(SENTENCES))
    ]
    together = talker.prefill_many(conds, [Sampling(), Sampling()])
    for cond, (_, slot, code, hidden) in zip(conds, together, strict=True):
        _, own_slot, own_code, own_hidden = talker.prefill(cond, Sampling())
        assert (code, slot.length) == (own_code, own_slot.length)
        torch.testing.assert_close(hidden, own_hidden, rtol=0, atol=1e-5)


def _clip(seconds: float = 1.3, rate: int = 24000) -> np.ndarray:
    """A gliding tone and a tremolo bell."""
    t = np.arange(int(seconds * rate)) / rate
    x = 0.4 * np.sin(2 * np.pi * 220 * t * (1 + 0.3 * t))
    x += 0.2 * np.sin(2 * np.pi * 523 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return x.astype(np.float32)


async def _cloned(engine, rid: str, clip: np.ndarray, vector: np.ndarray) -> list:
    parts = (
        MediaPart(kind="audio", blob=array_ref(clip), rate=24000),
        MediaPart(kind="speaker", blob=array_ref(vector)),
    )

    async def piece() -> AsyncIterator[InputPiece]:
        message = ChatMessage(role="user", content="", media=parts)
        yield InputPiece(text=" ".join(SENTENCES), messages=(message,), media=(clip, vector))

    params = StageParams(temperature=0.0, max_tokens=FRAMES)
    return [
        out.token_ids
        async for out in engine.generate(GenerateRequest(rid, "talker", params), piece())
        if out.token_ids
    ]


@pytest.mark.asyncio(loop_scope="module")
async def test_base_clones_with_the_speaker_vector_the_request_carries(tiny_models) -> None:
    import torch

    from omnix.engines.qwen3_tts_clone import VoiceCloner
    from omnix.engines.qwen3_tts_engine import Qwen3TTSEngine
    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker, SpeechRequest, VoiceClone
    from omnix.pipelines.config import Qwen3TTSTalkerArgs

    folder = tiny_models.qwen3_tts_base
    clip = _clip()
    own = VoiceCloner.load(folder).speaker_vector(torch.from_numpy(clip))
    carried = torch.flip(own, (0,))  # another voice's vector, for this clip
    talker = Qwen3TTSTalker.load(folder)

    def codes(vector: torch.Tensor) -> np.ndarray:
        clone = VoiceClone(speaker=vector)
        return talker.generate(
            SpeechRequest(text=" ".join(SENTENCES), clone=clone), max_new_tokens=FRAMES
        ).numpy()

    want, theirs = codes(carried), codes(own)
    assert not np.array_equal(want, theirs)
    engine = Qwen3TTSEngine(Qwen3TTSTalkerArgs(model=folder, max_batch=2))
    await engine.start()
    try:
        frames = await _cloned(engine, "carried", clip, carried.numpy())
        np.testing.assert_array_equal(np.asarray(frames).reshape(-1, 16), want)
        with pytest.raises(ValueError, match=r"speaker vector has shape \(32,\)"):
            await _cloned(engine, "narrow", clip, own.numpy()[:32])
    finally:
        await engine.close()
