"""``omnix bench serve`` against a real ``omnix serve`` on scripted engines,
and the ``vllm bench`` runner's CLI.

The servers are ``omnix serve --pipeline FILE.toml`` subprocesses (real
worker processes, scripted engines: fast, no model), one per module.  The
bench runs in the test's loop through ``bench(args)``, and once as the
``omnix bench serve --json`` command.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import socket
import struct
import sys
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio

from omnix.bench import serve as serve_bench
from omnix.bench.audio_meter import AudioMeter
from omnix.bench.serve_client import Client, Measure
from omnix.bench.serve_results import RequestRecord, ServeBenchResult
from omnix.bench.serve_wire import chunk_decoder
from omnix.testing.pipelines import scripted_omni_toml
from omnix.testing.served import ServeProcess, omnix_serve

#: The async tests share the module's loop (the servers' fixtures live on it).
aio = pytest.mark.asyncio(loop_scope="module")

IMAGE = """
name = "bench-image"
[[stages]]
name = "image"
engine = { kind = "scripted", chunks_per_piece = 1, delay_ms = 2, output_modality = "image" }
[outputs]
image = "image"
"""

#: Keys every summary has (vLLM bench serve's names where it has them).
KEYS = {
    "completed", "failed", "duration", "num_prompts", "model_id", "request_rate",
    "max_concurrency", "total_input_tokens", "total_output_tokens", "request_throughput",
    "output_throughput", "total_token_throughput", "first_errors", "total_audio_duration_s",
    "audio_throughput", "total_images", "image_throughput", "per_kind", "speech_stream",
} | {
    f"{stat}_{stem}"
    for stat in ("mean", "median", "std", "p50", "p90", "p99")
    for stem in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "audio_ttfp_ms", "audio_rtf", "audio_duration_s")
}  # fmt: skip

#: The statistics each kind must report (the others are null).
MEASURED = {
    "text": ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"),
    "audio-out": ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "audio_ttfp_ms", "audio_rtf", "audio_duration_s"),
    "speech": ("e2el_ms", "audio_ttfp_ms", "audio_rtf", "audio_duration_s"),
    "image": ("e2el_ms",),
}  # fmt: skip


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServeProcess]:
    path = tmp_path_factory.mktemp("bench") / "bench-omni.toml"
    path.write_text(scripted_omni_toml("bench-omni"))
    async with omnix_serve("--pipeline", str(path)) as served:
        yield served


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def image(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServeProcess]:
    path = tmp_path_factory.mktemp("bench") / "bench-image.toml"
    path.write_text(IMAGE)
    async with omnix_serve("--pipeline", str(path)) as served:
        yield served


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_bench.add_arguments(parser)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args([*argv, "--no-progress"])


def _summary(res: ServeBenchResult) -> dict[str, object]:
    out = json.loads(serve_bench._summary_json(res))
    assert isinstance(out, dict)
    return out


def _check(out: dict, kind: str, n: int) -> None:
    assert KEYS <= out.keys(), sorted(KEYS - out.keys())
    assert out["failed"] == 0, out["first_errors"]
    assert out["completed"] == n
    assert out["first_errors"] == []
    for stem in (
        "ttft_ms",
        "tpot_ms",
        "itl_ms",
        "e2el_ms",
        "audio_ttfp_ms",
        "audio_rtf",
        "audio_duration_s",
    ):
        values = [out[f"{s}_{stem}"] for s in ("mean", "p50", "p90", "p99")]
        if stem in MEASURED[kind]:
            assert None not in values, (stem, values)
            assert 0 < out[f"p50_{stem}"] <= out[f"p90_{stem}"] <= out[f"p99_{stem}"], (
                stem,
                values,
            )
            assert out[f"median_{stem}"] == out[f"p50_{stem}"]
        else:
            assert values == [None] * 4, (stem, values)
    assert out["request_throughput"] > 0


@pytest.mark.parametrize("kind", ["text", "audio-out", "speech"])
@aio
async def test_kind(omni: ServeProcess, kind: str) -> None:
    res = await serve_bench.bench(
        _args("--base-url", omni.url, "--kind", kind, "--num-prompts", "8", "--concurrency", "3")
    )
    out = _summary(res)
    _check(out, kind, 8)
    assert out["model_id"] == "bench-omni"  # the first of /v1/models
    assert out["per_kind"] == {
        kind: {"completed": 8, "failed": 0, "mean_e2el_ms": out["mean_e2el_ms"]}
    }
    if kind != "speech":
        assert out["total_output_tokens"] > 0 and out["output_throughput"] > 0
    if kind != "text":
        # scripted code2wav: 240 samples at 24 kHz per chunk
        assert out["total_audio_duration_s"] > 0
        assert all(r.audio_s > 0 and r.ttfp_s is not None for r in res.requests)
    if kind == "speech":
        assert out["speech_stream"] == "audio"  # omnix streams speech (stream_format)


@aio
async def test_speech_modes_agree(omni: ServeProcess) -> None:
    """Streamed raw, SSE and whole responses carry the same audio."""
    seconds = {}
    for mode, fmt in (("none", "wav"), ("sse", "pcm"), ("audio", "pcm")):
        res = await serve_bench.bench(
            _args("--base-url", omni.url, "--kind", "speech", "--num-prompts", "2",
                  "--speech-stream", mode, "--audio-format", fmt)
        )  # fmt: skip
        out = _summary(res)
        assert out["failed"] == 0, out["first_errors"]
        assert out["speech_stream"] == mode
        seconds[mode] = out["total_audio_duration_s"]
    assert seconds["none"] == pytest.approx(seconds["sse"]) == pytest.approx(seconds["audio"])


@aio
async def test_image(image: ServeProcess) -> None:
    res = await serve_bench.bench(
        _args("--base-url", image.url, "--kind", "image", "--num-prompts", "4")
    )
    out = _summary(res)
    _check(out, "image", 4)
    assert out["total_images"] == 4


@aio
async def test_mix_poisson_seeded_and_result_file(omni: ServeProcess, tmp_path: Path) -> None:
    argv = ("--base-url", omni.url, "--kind", "mix", "--mix", "text,audio-out,speech",
            "--num-prompts", "12", "--request-rate", "200", "--seed", "7", "--concurrency", "0")  # fmt: skip
    first = await serve_bench.bench(_args(*argv))
    second = await serve_bench.bench(_args(*argv))
    assert [r.kind for r in first.requests] == [r.kind for r in second.requests]
    assert len({r.kind for r in first.requests}) > 1
    out = _summary(first)
    assert out["failed"] == 0, out["first_errors"]
    assert out["max_concurrency"] is None and out["request_rate"] == 200.0
    assert sum(k["completed"] for k in out["per_kind"].values()) == 12
    # Poisson arrivals: requests start at increasing, spread times.
    starts = [r.start_s for r in first.requests]
    assert starts == sorted(starts) and starts[-1] > 0.005

    path = tmp_path / "result.json"
    rc = await asyncio.to_thread(
        serve_bench.run, _args(*argv, "--result-file", str(path), "--json")
    )
    assert rc == 0
    saved = json.loads(path.read_text())
    assert KEYS <= saved.keys()
    assert [r["index"] for r in saved["requests"]] == list(range(12))
    assert {"ttft_s", "itl_s", "ttfp_s", "audio_rtf", "e2el_s", "error"} <= saved["requests"][
        0
    ].keys()


@aio
async def test_refused_requests_are_counted_not_hidden(omni: ServeProcess) -> None:
    """An input_audio part omnix does not take (yet) is a failed request
    with the server's message; an unknown model too."""
    res = await serve_bench.bench(
        _args("--base-url", omni.url, "--kind", "audio-in", "--num-prompts", "3")
    )
    out = _summary(res)
    assert out["completed"] + out["failed"] == 3
    if out["failed"]:
        assert out["first_errors"] and all(e.startswith("audio-in (") for e in out["first_errors"])
        assert all("\n" not in e for e in out["first_errors"])

    res = await serve_bench.bench(
        _args("--base-url", omni.url, "--model", "nope", "--num-prompts", "3")
    )
    out = _summary(res)
    assert out["failed"] == 3 and out["completed"] == 0
    assert out["first_errors"][0].startswith("text (3 requests): HTTP 404")
    assert out["mean_e2el_ms"] is None


def _cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "omnix.cli", "bench", "serve", *argv]


@aio
async def test_cli_json_last_line(omni: ServeProcess) -> None:
    proc = await asyncio.create_subprocess_exec(
        *_cli("--base-url", omni.url, "--kind", "audio-out", "--num-prompts", "4", "--json"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, stderr.decode()
    out = json.loads(stdout.decode().strip().splitlines()[-1])
    _check(out, "audio-out", 4)


@aio
async def test_cli_unreachable_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        *_cli("--base-url", f"http://127.0.0.1:{port}", "--num-prompts", "1"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert stderr.decode().strip() == (
        f"omnix bench serve: cannot reach http://127.0.0.1:{port}: Connection refused"
    )


# -- the audio meter (no server) --------------------------------------------------


def _wav(samples: int, rate: int = 16000, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * samples * channels)
    return buf.getvalue()


def test_audio_meter_wav_split_anywhere() -> None:
    data = _wav(8000)  # 0.5 s
    for cut in (1, 3, 11, 20, 40, 44, 45, 100):
        m = AudioMeter(24000)
        m.feed(data[:cut])
        m.feed(data[cut:])
        assert m.seconds == pytest.approx(0.5), cut


def test_audio_meter_streamed_header_and_chunk_files() -> None:
    # A streamed WAV: sizes unknown (0xFFFFFFFF), an extra chunk before data.
    fmt = struct.pack("<HHIIHH", 1, 2, 8000, 8000 * 4, 4, 16)
    head = (b"RIFF" + b"\xff\xff\xff\xff" + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
            + b"LIST" + struct.pack("<I", 3) + b"abc\0" + b"data" + b"\xff\xff\xff\xff")  # fmt: skip
    m = AudioMeter(24000)
    m.feed(head)
    assert m.sample_bytes == 0  # a header is not audio: no TTFP yet
    m.feed(b"\0" * 16000)  # 8 kHz stereo 16-bit: 0.5 s
    assert m.seconds == pytest.approx(0.5)
    # A server that sends each chunk as a WAV file of its own.
    m = AudioMeter(24000)
    for _ in range(3):
        m.feed(_wav(1600))
    assert m.seconds == pytest.approx(0.3)
    # Raw PCM at the given rate.
    m = AudioMeter(24000)
    m.feed(b"\1\0" * 12000)
    assert m.seconds == pytest.approx(0.5)


def test_result_structs_roundtrip() -> None:
    rec = RequestRecord(index=0, kind="text", ok=True, itl_s=[0.1])
    assert msgspec.json.decode(msgspec.json.encode(rec), type=RequestRecord) == rec


# -- the vllm bench runner ---------------------------------------------------------


@pytest.mark.slow
def test_vllm_bench_help_runs_without_gpu() -> None:
    import subprocess

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "omnix.bench.vllm_bench", "serve", "--help"],
        capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: vllm bench serve" in done.stdout
    assert "PackageNotFoundError" not in done.stderr


def test_vllm_omni_shaped_chunks() -> None:
    """vLLM-Omni streams audio as one base64 WAV per chunk in delta.content
    ("modality": "audio"), with usage on every chunk."""
    import base64

    client = Client(None, "http://x", "m", _args("--base-url", "http://x"))
    m = Measure(24000)
    wav = base64.b64encode(_wav(2400, rate=24000)).decode()
    chunks = [
        {"modality": "text", "choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"modality": "text", "choices": [{"delta": {"content": "Hi"}}], "usage": {"prompt_tokens": 5, "completion_tokens": 1}},
        {"modality": "text", "choices": [{"delta": {"content": " there"}}], "usage": {"prompt_tokens": 5, "completion_tokens": 2}},
        {"modality": "audio", "choices": [{"delta": {"content": wav}}], "usage": {"prompt_tokens": 5, "completion_tokens": 0}},
        {"modality": "audio", "choices": [{"delta": {"content": wav}}], "usage": {"prompt_tokens": 5, "completion_tokens": 0}},
    ]  # fmt: skip
    for c in chunks:
        client._chat_chunk(m, chunk_decoder.decode(json.dumps(c).encode()))
    assert m.text_chunks == 2 and m.ttft is not None and len(m.itl) == 1
    assert m.audio.seconds == pytest.approx(0.2) and m.ttfp is not None
    assert m.usage is not None and m.usage.completion_tokens == 2
