"""Fixtures for the real-engine tests: the session's tiny models and ONE
started engine per model, shared by every test of the session (starting a
vLLM engine takes ~20-40 s on 2 cores).

The engines live in the session's event loop, so tests that use them run
there too (``pytestmark = pytest.mark.asyncio(loop_scope="session")``).
"""

from __future__ import annotations

import asyncio
import os

import pytest
import pytest_asyncio


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    # On 2 cores torch's pool fights the streaming thread (docs/runtime.md).
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


_VLLM_FIXTURES = {"vllm_engines", "thinker", "talker"}


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(config, items) -> None:
    config._omnix_needs_vllm = any(_VLLM_FIXTURES & set(item.fixturenames) for item in items)


def _start_vllm():
    """The tiny thinker's and talker's engines, starting: (thinker, talker,
    the future of both starts)."""
    from omnix.engines.vllm_engine import VllmEngine
    from omnix.pipelines.config import VllmArgs

    thinker = VllmEngine(VllmArgs(model="thinker", max_num_seqs=8, max_model_len=512))
    talker = VllmEngine(
        VllmArgs(
            model="talker",
            max_num_seqs=8,
            max_model_len=512,
            input_mode="token_ids",
            output_modality="codec",
        )
    )
    # vLLM (and the transformers it imports) imported here, on this thread:
    # the engines import them in their start-up threads, and a test beside
    # them importing transformers too could see it half-initialised.
    import vllm.v1.engine.async_llm  # noqa: F401

    return thinker, talker, asyncio.ensure_future(asyncio.gather(thinker.start(), talker.start()))


@pytest_asyncio.fixture(scope="session", loop_scope="session", autouse=True)
async def _prestart_vllm(request):
    """When any collected test needs the vLLM engines, start them at the
    first test of this folder, so their start-up (mostly spawned processes
    importing torch and vLLM) overlaps the codec and diffusers tests instead
    of being waited for in a row.  Not under pytest-xdist: there a worker
    may run none of the tests that need them (``vllm_engines`` starts them
    on first use)."""
    if not getattr(request.config, "_omnix_needs_vllm", False) or os.environ.get(
        "PYTEST_XDIST_WORKER"
    ):
        yield None
        return
    request.getfixturevalue("tiny_models")
    thinker, talker, started = _start_vllm()
    for _ in range(5):
        # Let both start() calls reach their engine-building thread: from
        # there they progress while synchronous tests hold the loop.
        await asyncio.sleep(0)
    yield thinker, talker, started
    try:
        await started
    finally:
        await asyncio.gather(thinker.close(), talker.close())


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def vllm_engines(_prestart_vllm, tiny_models):
    """The thinker and the talker, one engine each for the whole session."""
    if _prestart_vllm is not None:
        thinker, talker, started = _prestart_vllm
        await started
        yield thinker, talker
        return
    thinker, talker, started = _start_vllm()
    try:
        await started
        yield thinker, talker
    finally:
        await asyncio.gather(thinker.close(), talker.close())


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def thinker(vllm_engines):
    return vllm_engines[0]


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def talker(vllm_engines):
    return vllm_engines[1]


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def omni_thinker(tiny_models):
    """tiny-omni's multimodal thinker (audio and image input), started on
    first use: only the media tests need it."""
    from omnix.engines.vllm_engine import VllmEngine
    from omnix.pipelines.config import VllmArgs

    engine = VllmEngine(
        VllmArgs(
            model="omni_thinker",
            max_num_seqs=4,
            max_model_len=2048,
            kv_cache_gib=0.25,
            limit_mm_per_prompt={"audio": 1, "image": 1, "video": 0},
        )
    )
    await engine.start()
    yield engine
    await engine.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def codec_engine(tiny_models):
    from omnix.engines.codec_engine import CodecEngine
    from omnix.pipelines.config import CodecArgs

    engine = CodecEngine(CodecArgs(model="code2wav", device="cpu"))
    await engine.start()
    yield engine
    await engine.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def image_engine(tiny_models):
    from omnix.engines.diffusers_engine import DiffusersEngine
    from omnix.pipelines.config import DiffusersArgs

    engine = DiffusersEngine(DiffusersArgs(model="image", device="cpu"))
    await engine.start()
    yield engine
    await engine.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def batch_engine(tiny_models):
    """The tiny image model batching up to 4 equal-shape requests, its
    edits Kontext's reference-image edit (the stage's ``edit``)."""
    from omnix.engines.diffusers_engine import DiffusersEngine
    from omnix.pipelines.config import DiffusersArgs

    engine = DiffusersEngine(
        DiffusersArgs(model="image", device="cpu", max_batch=4, edit="reference")
    )
    await engine.start()
    yield engine
    await engine.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def video_engine(tiny_models):
    """The tiny Wan 2.2 text/image-to-video model, batching up to 2."""
    from omnix.engines.diffusers_engine import DiffusersEngine
    from omnix.pipelines.config import DiffusersArgs

    engine = DiffusersEngine(
        DiffusersArgs(
            model="video", device="cpu", output_modality="video", default_size=32, max_batch=2
        )
    )
    await engine.start()
    yield engine
    await engine.close()
