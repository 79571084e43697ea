"""``compile`` of a diffusion stage's denoiser is refused, in one line, on a
device torch.compile cannot build for: CUDA without Triton, a CPU without a
C++ compiler, any other device; the engine says so when it starts, before
loading the model.  (Compiling itself is measured by the GPU bench and
docs/engines.md, "Compilation": inductor takes minutes on this CPU.)"""

from __future__ import annotations

import importlib.util

import pytest

from omnix.engines.diffusers_cache import compile_problem


def test_compile_off_is_never_refused() -> None:
    assert compile_problem("off", "mps") is None


def test_compile_on_cuda_without_triton_is_refused(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a)
    )
    assert compile_problem("blocks", "cuda:1") == (
        "engine.compile = 'blocks': torch.compile on cuda:1 needs Triton; "
        "set compile = 'off' (or --compile off)"
    )


def test_compile_on_a_cpu_without_a_cpp_compiler_is_refused(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert "torch.compile on the CPU needs a C++ compiler" in (
        compile_problem("model", "cpu") or ""
    )


def test_compile_on_another_device_is_refused() -> None:
    assert compile_problem("blocks", "mps") == (
        "engine.compile = 'blocks': omnix compiles the denoiser on cuda and cpu, not mps; "
        "set compile = 'off' (or --compile off)"
    )


@pytest.mark.engines
@pytest.mark.asyncio
async def test_the_engine_refuses_compile_at_start_before_loading(
    tiny_models, monkeypatch, tmp_path
) -> None:
    from omnix.engines.diffusers_engine import DiffusersEngine
    from omnix.pipelines.config import DiffusersArgs

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    engine = DiffusersEngine(
        DiffusersArgs(model=str(tiny_models.image), device="cpu", compile="blocks")
    )
    with pytest.raises(ValueError, match=r"torch.compile on the CPU needs a C\+\+ compiler"):
        await engine.start()
    assert engine.pipe is None
