"""Run in a child process by test_qwen3_omni.py: start vLLM (engine core
spawned, so the torchvision shim must arrive through omnix's
``vllm.general_plugins`` entry point) on the tiny Qwen3-Omni thinker, send a
text chat, one with an ``input_audio`` part and one with an ``image_url``
part, and print their prompt and output token counts as one JSON line."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import sys
from typing import Any

ENGINE: dict[str, Any] = {
    "dtype": "float32",
    "max_model_len": 2048,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 2048,
    "enforce_eager": True,
    "kv_cache_memory_bytes": 256 * 2**20,
    "limit_mm_per_prompt": {"audio": 1, "image": 1, "video": 0},
    "distributed_executor_backend": "uni",
    "disable_log_stats": True,
}


def wav_b64(seconds: float = 2.0, sr: int = 16_000) -> str:
    import numpy as np
    import soundfile as sf

    t = np.arange(int(seconds * sr)) / sr
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), sr, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def png_url(width: int = 320, height: int = 224) -> str:
    import numpy as np
    from PIL import Image

    rgb = np.zeros((height, width, 3), np.uint8)
    rgb[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)[None, :]
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def chat(engine: Any, name: str, content: Any) -> dict[str, int]:
    from vllm import SamplingParams
    from vllm.renderers import ChatParams

    _, (prompt,) = await engine.renderer.render_chat_async(
        [[{"role": "user", "content": content}]], ChatParams()
    )
    final = None
    async for out in engine.generate(
        prompt, SamplingParams(max_tokens=8, temperature=0.0), request_id=name
    ):
        final = out
    assert final is not None
    return {"prompt": len(final.prompt_token_ids or []), "output": len(final.outputs[0].token_ids)}


async def main(model: str) -> None:
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **ENGINE))
    try:
        text = "Describe it."
        audio = {"type": "input_audio", "input_audio": {"data": wav_b64(), "format": "wav"}}
        image = {"type": "image_url", "image_url": {"url": png_url()}}
        counts = {
            "text": await chat(engine, "text", text),
            "audio": await chat(engine, "audio", [audio, {"type": "text", "text": text}]),
            "image": await chat(engine, "image", [image, {"type": "text", "text": text}]),
        }
    finally:
        engine.shutdown()
        del engine
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    asyncio.run(main(sys.argv[1]))
    os._exit(0)  # vLLM's atexit teardown adds nothing here and can print noise
