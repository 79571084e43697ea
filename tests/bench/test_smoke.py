"""Every ``omnix bench`` verb, run as a user runs it, in a quick mode.

A bench nobody runs rots (``omnix bench engines`` crashed before its first
figure; ``omnix bench failover``'s restart part was refused 400 once SSE ids
became opt-in).  Each test runs ``omnix bench NAME --json`` in a subprocess
with few requests and small sizes (scripted engines wherever the bench can
take a pipeline) and checks the last line of stdout: one JSON object
carrying the keys the bench's docstring names.  The figures themselves are
not judged: a quick run on a busy machine measures nothing.

``omnix bench serve`` needs a live server: ``test_serve_bench.py`` runs it
the same way (``test_cli_json_last_line``) against the scripted servers it
starts.  ``engines`` compares with vLLM driven directly, so it needs the
real engines and the tiny models (marked ``engines``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from omnix.bench.cli import BENCHES
from omnix.testing.pipelines import scripted_omni_toml

ROOT = Path(__file__).resolve().parents[2]

#: a one-stage text pipeline slow enough to be killed mid-stream
SLOW_TEXT = """
name = "smoke-text"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 1000, delay_ms = 20 }
[outputs]
text = "thinker"
"""


def bench(name: str, *argv: str | Path, timeout: float = 120) -> dict[str, Any]:
    """``omnix bench NAME ARGV --json``'s last line, after it exited 0."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "omnix.cli", "bench", name, *map(str, argv), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    took = time.perf_counter() - t0
    assert done.returncode == 0, (
        f"exit {done.returncode} after {took:.1f} s:\n{done.stderr[-3000:]}"
    )
    last = done.stdout.strip().splitlines()[-1]
    out = json.loads(last)
    assert isinstance(out, dict), last
    return out


def assert_has_keys(out: dict[str, Any], *keys: str) -> None:
    missing = [k for k in keys if k not in out]
    assert not missing, f"missing {missing} in {sorted(out)}"


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("smoke")
    paths = {"omni": d / "omni.toml", "slow-text": d / "slow-text.toml"}
    paths["omni"].write_text(scripted_omni_toml("smoke-omni"))
    paths["slow-text"].write_text(SLOW_TEXT)
    return paths


def test_every_bench_has_a_smoke_test():
    here = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert set(BENCHES) - {"serve"} <= here, sorted(set(BENCHES) - here)
    serve = (Path(__file__).parent / "test_serve_bench.py").read_text()
    assert "def test_cli_json_last_line(" in serve  # bench serve's


def test_log(tmp_path):
    out = bench("log", "--events", "2000", "--memory-events", "2000", "--repeat", "1")
    assert_has_keys(
        out,
        "memory_append_fold_events_per_s", "disk_batched_fsync_events_per_s", "fold_1m_seconds",
        "reopen_1m_seconds", "reopen_after_1m_events_s", "reopen_after_1m_folded_events",
        "reopen_after_1m_indexed_events", "memory_append_fold_retention_events_per_s",
        "state_bytes_per_request", "peak_rss_mb", "memory_append_fold_events_per_cpu_s",
        "disk_batched_fsync_events_per_cpu_s",
    )  # fmt: skip
    assert out["events"] == 2000


def test_log_nats():
    """``--backend nats`` starts its own nats-server nodes (one, then three)."""
    out = bench("log", "--backend", "nats", "--nats-events", "3000", "--repeat", "1")
    assert_has_keys(
        out,
        "nats_append_events_per_s", "nats_append_events_per_s_r3", "nats_messages",
        "nats_events_per_message", "load_average",
    )  # fmt: skip
    assert out["events"] == 3000 and out["nats_messages"] >= 1


def test_hop():
    out = bench("hop", "--hops", "20", "--chunks", "200")
    assert_has_keys(
        out, "hop_p50_us", "hop_p99_us", "chunk_events_per_s", "zmq_rtt_p50_us", "zmq_rtt_p99_us"
    )
    assert out["hops"] == 20


def test_http():
    out = bench("http", "--streams", "20", "--seconds", "5", "--concurrency", "4")
    assert_has_keys(out, "sse_streams_per_s", "sse_events_per_s", "omni_streams_per_s")
    assert out["errors"] == 0 and out["streams"] > 0


def test_media():
    out = bench(
        "media", "--requests", "3", "--media-requests", "1", "--image-mb", "0.1",
        "--audio-s", "0.5",
    )  # fmt: skip
    assert_has_keys(
        out,
        "ttft_ms_text_alone", "ttft_ms_text_beside_media", "admission_ms_per_mb",
        "beside_over_alone", "ttft_ms_image", "ttft_ms_audio",
    )  # fmt: skip
    assert out["errors"] == 0


def test_replay(tmp_path):
    # --trace: a trace of the corpus, so the run writes nothing to the cache.
    out = bench("replay", "--trace", ROOT / "replay" / "scripted-omni-busy.trace", "--repeat", "1")
    assert_has_keys(
        out,
        "fold_events_per_s",
        "drive_events_per_s",
        "fold_cpu_events_per_s",
        "drive_cpu_events_per_s",
    )


def test_telemetry():
    out = bench("telemetry", "--requests", "5", "--rounds", "2")
    assert_has_keys(out, "telemetry_throughput_ratio", "telemetry_traces_throughput_ratio")


def test_failover(pipelines):
    out = bench(
        "failover", "--pipeline", pipelines["slow-text"], "--runs", "2", "--max-tokens", "16"
    )
    assert_has_keys(
        out,
        "migrations_ok", "migrate_gap_p50_ms", "migrate_gap_max_ms", "replica_back_p50_s",
        "restart_resume_s", "restart_ready_s",
    )  # fmt: skip
    assert out["migrations_ok"] == out["runs"] == 2


def test_failover_on_nats(pipelines):
    out = bench(
        "failover", "--backend", "nats", "--pipeline", pipelines["slow-text"], "--runs", "1",
        "--streams", "2", "--ttft-requests", "2", "--max-tokens", "24",
    )  # fmt: skip
    assert_has_keys(
        out, "takeover_s", "frontend_gap_p50_ms", "lost_requests", "ttft_ratio_vs_local"
    )
    assert out["lost_requests"] == 0


def test_soak(pipelines):
    out = bench(
        "soak", "--pipeline", pipelines["omni"], "--warmup", "4", "--requests", "12",
        "--segment", "6", "--retain-requests", "4", "--concurrency", "2",
    )  # fmt: skip
    assert_has_keys(out, "rss_growth_kb_per_request", "rss_mb_by_segment", "retained_requests")
    assert out["errors"] == 0 and len(out["rss_mb_by_segment"]) == 2


def _no_vllm() -> str | None:
    for dist in ("vllm", "torch"):
        if importlib.util.find_spec(dist) is None:
            return f"{dist} is not installed"
    return None


@pytest.mark.engines
@pytest.mark.skipif(_no_vllm() is not None, reason=f"real engines unavailable: {_no_vllm()}")
def test_engines(pipelines, tmp_path_factory):
    """The tiny-text part on vLLM (both sides), one level; the TTFP part's
    code on a scripted thinker -> talker -> code2wav."""
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)  # OMNIX_MODEL_DIR for the subprocess
    out = bench(
        "engines", "--levels", "1", "--rounds", "1", "--requests", "1", "--max-tokens", "8",
        "--settle", "0", "--ttfp-pipeline", pipelines["omni"], "--ttfp-requests", "1",
        "--thinker-tokens", "8", "--talker-tokens", "4",
        timeout=600,
    )  # fmt: skip
    assert_has_keys(
        out,
        "ttft_p50_ratio_c1", "tokens_per_s_ratio_c1", "ttft_p50_ms_direct_c1", "ttft_p50_ms_omnix_c1",
        "same_tokens_c1", "ttft_ok_c1", "tokens_per_s_ok_c1", "ttfp_ms_chunked",
        "ttfp_ms_unchunked", "ttfp_cut", "ttfp_ok",
    )  # fmt: skip
    assert out["levels"] == [1] and out["ttfp_requests"] == 1


@pytest.mark.engines
@pytest.mark.skipif(_no_vllm() is not None, reason=f"real engines unavailable: {_no_vllm()}")
def test_speech(tmp_path_factory):
    """One short prompt, alone and as a batch of one, on the tiny whole
    Qwen3-Omni: transformers and omnix (vLLM thinker) in one run."""
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)  # OMNIX_MODEL_DIR for the subprocess
    out = bench(
        "speech", "--prompts", "1", "--concurrency", "1", "--thinker-tokens", "6",
        "--talker-tokens", "8", timeout=600,
    )  # fmt: skip
    assert_has_keys(
        out,
        "oracle_equal", "ttfp_ms", "rtf", "ttfp_ratio_vs_transformers",
        "throughput_ratio_vs_transformers",
    )  # fmt: skip
    assert out["oracle_equal"] is True


@pytest.mark.engines
def test_speech_stages(tmp_path_factory):
    """The speech stages alone (the GPU bench's path), on the tiny model and
    the CPU with static decoding: transformers' talker generate against the
    talker and Code2Wav engines, two levels, one run."""
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)  # OMNIX_MODEL_DIR for the subprocess
    out = bench(
        "speech", "--stages", "--levels", "1,2", "--frames", "12", "--runs", "1",
        "--decode", "static", "--reference-frames", "4", timeout=600,
    )  # fmt: skip
    assert_has_keys(
        out,
        "card", "transformers_ms_per_frame", "transformers_rtf", "code2wav_ms_per_frame",
        "code2wav_ms_per_frame_batch16", "rtf", "audio_s_per_s", "first_packet_ms", "rtf_min",
    )  # fmt: skip
    assert out["card"] == "cpu" and set(out["rtf"]) == {"1", "2"}
    assert all(v > 0 for v in out["audio_s_per_s"].values())


def _no_reference() -> str | None:
    from omnix.testing.qwen3_tts_oracle import reference_python

    python = reference_python()
    return None if python.exists() else f"no reference environment at {python.parent.parent}"


@pytest.mark.engines
@pytest.mark.skipif(_no_reference() is not None, reason=f"{_no_reference()}")
def test_tts(tmp_path_factory):
    """The tiny Qwen3-TTS CustomVoice served by ``omnix serve`` (real
    workers) against qwen-tts in its environment: two levels, one run,
    three words, eleven frames an answer."""
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)  # OMNIX_MODEL_DIR for the subprocess
    out = bench(
        "tts", "--runs", "1", "--levels", "1,2", "--max-tokens", "12", "--words", "3",
        timeout=600,
    )  # fmt: skip
    assert_has_keys(
        out,
        "oracle_equal", "ttfp_ms", "rtf", "audio_s_per_s", "ref_ttfp_ms", "ref_rtf",
        "ref_audio_s_per_s", "ttfp_ratio_vs_reference", "throughput_ratio_vs_reference",
        "load_avg_before", "load_avg_after", "ttfp_ms_min", "ref_audio_s_per_s_min",
    )  # fmt: skip
    assert out["oracle_equal"] is True and out["oracle_frames"] == 11
    assert set(out["audio_s_per_s"]) == set(out["ref_audio_s_per_s"]) == {"1", "2"}
    assert out["throughput_level"] == 2 and out["ref_streams"] is False


def test_tts_stages(tmp_path_factory):
    """Qwen3-TTS's stages alone (the GPU bench's path) on the tiny
    CustomVoice and the CPU: the talker feeding the decoder in-process, two
    levels, one run, seven frames an answer."""
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)  # OMNIX_MODEL_DIR for the subprocess
    out = bench(
        "tts", "--sizes", "tiny", "--levels", "1,2", "--runs", "1", "--max-tokens", "8",
        "--words", "3", timeout=300,
    )  # fmt: skip
    assert_has_keys(
        out, "card", "ttfp_ms", "rtf", "audio_s_per_s", "talker_audio_s_per_s", "start_s",
        "frames", "parameters", "vllm_omni",
    )  # fmt: skip
    assert out["card"] == "cpu" and out["sizes"] == "tiny" and out["frames"] == 7
    assert set(out["audio_s_per_s"]) == {"1", "2"} and out["rtf"]["1"] > 0
    assert out["vllm_omni"]["ttfp_ms"] == 47.0 and "ttfp_ratio_vs_vllm_omni" in out["vllm_omni"]


@pytest.mark.engines
@pytest.mark.skipif(
    importlib.util.find_spec("diffusers") is None, reason="real engines unavailable: no diffusers"
)
def test_diffusion(tmp_path_factory):
    """tiny-image on its real diffusers engine: a few images per level, one cancel."""
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)  # OMNIX_MODEL_DIR for the subprocess
    out = bench(
        "diffusion", "--part", "http", "--requests", "4", "--rounds", "1", "--cancels", "1",
        "--steps", "2", timeout=300,
    )  # fmt: skip
    assert_has_keys(
        out,
        "images_per_s_c1", "images_per_s_c4", "images_per_s_c4_over_c1", "e2e_ms_p50_c1",
        "e2e_ms_p50_c4", "cancel_steps_after_p50", "cancel_steps_after_max", "cancel_ms_p50",
        "load_avg_1m",
    )  # fmt: skip
    assert out["errors"] == 0 and out["requests"] == 4 and out["pipeline"] == "tiny-image"


def test_diffusion_cache_table(tmp_path_factory):
    """Each cache against none on tiny-image and tiny-video: rates and the
    fidelity to the uncached output of the same seed, per pipeline."""
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)
    out = bench(
        "diffusion", "--part", "caches", "--cache-requests", "1", "--steps", "3",
        "--cache", "first_block,threshold=0.6", timeout=300,
    )  # fmt: skip
    assert set(out["caches"]) == {"tiny-image", "tiny-video"}
    image, video = out["caches"]["tiny-image"], out["caches"]["tiny-video"]
    assert set(image) == set(video) == {"off", "first_block,threshold=0.6"}
    assert_has_keys(image["off"], "steps_per_s", "images_per_s_c1", "images_per_s_c4")
    assert_has_keys(video["off"], "steps_per_s", "video_s_per_s_c1", "video_s_per_s_c4")
    for row in (image["first_block,threshold=0.6"], video["first_block,threshold=0.6"]):
        assert_has_keys(row, "psnr_db_min", "max_pixel_diff", "speedup_steps")
        assert 0 <= row["max_pixel_diff"] <= 255


def test_diffusion_cfg_batch_table(tmp_path_factory):
    """tiny-video's guidance in one forward against two: rates at c=1 and
    c=4 on each side, and on's fidelity to off's video of the same seed."""
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)
    out = bench(
        "diffusion", "--part", "cfg", "--cfg-requests", "1", "--steps", "2", timeout=300
    )  # fmt: skip
    table = out["cfg_batch"]
    assert table["pipeline"] == "tiny-video" and table["steps"] == 2
    for side in (table["off"], table["on"]):
        assert_has_keys(
            side, "steps_per_s_c1", "steps_per_s_c4", "video_s_per_s_c1", "video_s_per_s_c4"
        )  # fmt: skip
    assert_has_keys(
        table["on"], "speedup_steps_c1", "speedup_steps_c4", "psnr_db_min", "max_pixel_diff",
        "identical_videos",
    )  # fmt: skip
    assert table["on"]["videos_compared"] == 5 and 0 <= table["on"]["max_pixel_diff"] <= 255
    assert out["errors"] == 0 and "load_avg_1m" in out


#: thinker -> talker -> code2wav that takes audio, its speech flowing
#: while the text is written: a voice session's pipeline, in seconds
REALTIME = scripted_omni_toml(
    "smoke-realtime",
    thinker='engine = { kind = "scripted", chunks_per_piece = 200, delay_ms = 5 }\n'
    "media = { audio = true }",
    edge_thinker='forward = "chunk"\nevery = 4',
)


def test_realtime(tmp_path):
    cfg = tmp_path / "realtime.toml"
    cfg.write_text(REALTIME)
    out = bench("realtime", "--pipeline", cfg, "--sessions", "2", "--runs", "2")
    assert_has_keys(
        out,
        "ttfa_p50_ms", "ttfa_ratio_vs_http", "bargein_gap_p50_ms", "sessions_ok",
        "http_ttfa_p50_ms", "ttfa_p50_ms_min", "ttfa_p50_ms_runs", "sessions_total",
    )  # fmt: skip
    assert out["sessions_ok"] == out["sessions_total"] == 4
    assert len(out["ttfa_p50_ms_runs"]) == 2


@pytest.mark.engines
def test_duplex(tmp_path):
    """One and two sessions at once on ``omnix serve`` of a tiny Moshi,
    real WebSocket clients speaking in real time: a few frames, one run."""
    from omnix.models.moshi import write_folder

    write_folder(tmp_path / "moshi", seed=0)
    out = bench(
        "duplex", "--model", tmp_path / "moshi", "--levels", "1,2", "--frames", "6",
        "--runs", "1", timeout=300,
    )  # fmt: skip
    assert_has_keys(
        out,
        "frame_latency_ms_p50", "frame_latency_ms_p99", "frame_latency_ms_p99_min",
        "frame_latency_ms_p99_runs", "frames_late", "frames_late_fraction", "sessions_held",
        "frames_missing", "load_avg_1m_start", "load_avg_1m_end", "cpu_count",
    )  # fmt: skip
    assert out["path"] == "served" and out["sessions"] == [1, 2] and out["runs"] == 1
    assert set(out["frame_latency_ms_p50"]) == {"1", "2"}
    assert out["frames_missing"] == 0 and out["errors"] == []


@pytest.mark.engines
def test_duplex_tick_alone():
    """The GPU bench's path (the engine's tick alone, random weights built
    in the process) at the tiny size on the CPU."""
    out = bench(
        "duplex", "--sizes", "tiny", "--device", "cpu", "--levels", "1,2", "--frames", "4",
        "--runs", "2", "--context-frames", "3", "--warmup", "1",
    )  # fmt: skip
    assert_has_keys(
        out,
        "frame_latency_ms_p50", "frame_latency_ms_p99", "frames_late", "sessions_held",
        "encode_ms_p50", "step_ms_p50", "step_ms_p99", "decode_ms_p50",
        "sessions_held_step_alone", "card", "parameters", "build_s", "frame_latency_ms_p50_min",
    )  # fmt: skip
    assert out["path"] == "tick" and out["sizes"] == "tiny" and out["dtype"] == "float32"
    # Levels stop rising past the first over 80 ms: a loaded machine may stop at 1.
    assert "1" in out["frame_latency_ms_p50"] and len(out["frame_latency_ms_p50_runs"]["1"]) == 2


def test_placement():
    # A real loopback Ray cluster, two servers and a node lost: one run.
    out = bench("placement", "--runs", "1", "--requests", "2", timeout=300)
    assert_has_keys(
        out,
        "ready_s_ray", "ready_s_spawn", "node_loss_recovery_s", "lost_requests",
        "ready_s_ray_min", "ready_s_ray_median", "node_loss_recovery_s_min",
        "load_average_start", "load_average_end",
    )  # fmt: skip
    assert out["lost_requests"] == 0


def test_startup():
    # One warm and one cold start of the Qwen3-TTS pipeline (torch and
    # transformers to import, no vLLM: the quickest with a zygote).
    out = bench("startup", "--pipeline", "tiny-tts", "--runs", "1", timeout=300)
    assert_has_keys(
        out,
        "ready_s_warm_min", "ready_s_warm_median", "ready_s_cold_min", "ready_s_cold_median",
        "cpu_s_warm_median", "cpu_s_cold_median", "ready_cold_over_warm", "cpu_cold_over_warm",
        "load_avg_1m_before", "load_avg_1m_after",
    )  # fmt: skip
    assert out["pipeline"] == "tiny-tts" and out["runs"] == 1
    # Each start was timed and its processes' CPU counted (the server alone spends seconds).
    for kind in ("warm", "cold"):
        assert out[f"ready_s_{kind}_min"] > 0 and out[f"cpu_s_{kind}_median"] >= 1.0, out
