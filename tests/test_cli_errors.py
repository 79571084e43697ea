"""A user's mistake on the ``omnix`` command line ends in one line, never a
traceback: ``omnix VERB: error: <what was wrong, naming the input>`` on
stderr and a non-zero exit status (``omnix.usage``).

Each case runs the command as a user would (a subprocess) and fails fast:
none starts a worker.  A mistake argparse can see is reported by argparse
(its usage lines, then the error line); one found later is the only line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omnix.testing.pipelines import scripted_omni_toml

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "replay" / "scripted-omni-normal.trace"


def omnix(*argv: str | Path, cwd: Path = ROOT) -> tuple[int, list[str]]:
    """Run ``omnix ARGV``; its exit status and stderr lines.  vLLM is told
    to log its warnings, as a user's shell may: the notes it makes while
    the CLI imports it (Triton without a CPU backend) stay out anyway."""
    done = subprocess.run(
        [sys.executable, "-m", "omnix.cli", *map(str, argv)],
        cwd=cwd,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stderr.strip().splitlines()


def one_line_error(code: int, lines: list[str], verb: str, *says: str, status: int = 2) -> str:
    """The error is the last line, says what it names, and nothing but
    argparse's usage comes before it."""
    assert code == status, lines
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    *before, last = lines
    assert last.startswith(f"omnix {verb}: error: "), lines
    for word in says:
        assert word in last, (word, last)
    if before:  # argparse's usage lines, nothing else
        assert before[0].startswith("usage: "), lines
    return last


@pytest.fixture(scope="module")
def omni_toml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "omni.toml"
    path.write_text(scripted_omni_toml("cli-omni"))
    return path


# -- the cases -------------------------------------------------------------------


def test_worker_connect_not_an_endpoint():
    code, err = omnix("worker", "--connect", "bogus", "--stage", "thinker")
    one_line_error(code, err, "worker", "--connect", "'bogus'", "tcp://HOST:PORT")


def test_worker_connect_without_a_port():
    code, err = omnix("worker", "--connect", "tcp://host", "--stage", "thinker")
    one_line_error(code, err, "worker", "--connect", "'tcp://host'", "needs a host and a port")


def test_replay_html_into_a_missing_folder(tmp_path):
    page = tmp_path / "missing" / "page.html"
    code, err = omnix("replay", TRACE, "--html", page)
    one_line_error(code, err, "replay", f"--html {page}", "cannot write it")
    assert len(err) == 1


def test_telemetry_port_out_of_range():
    code, err = omnix("telemetry", "--trace", TRACE, "--prometheus-port", "99999")
    one_line_error(code, err, "telemetry", "--prometheus-port", "99999", "0 to 65535")


def test_trace_export_of_a_malformed_pipeline_json(tmp_path):
    (tmp_path / "events").mkdir()
    (tmp_path / "pipeline.json").write_text('{"name": 5}')
    code, err = omnix("trace", "export", "--log-dir", tmp_path, "--all")
    one_line_error(code, err, "trace export", f"{tmp_path}/pipeline.json", "not a pipeline config")
    assert len(err) == 1


def test_models_init_into_a_folder_that_cannot_be_made():
    code, err = omnix("models", "init", "--dir", "/proc/nope")
    one_line_error(code, err, "models init", "--dir /proc/nope", "cannot build models there")
    assert len(err) == 1  # before any model was built (no progress bar)


def test_replay_of_a_directory(tmp_path):
    code, err = omnix("replay", tmp_path)
    one_line_error(code, err, "replay", str(tmp_path), "Is a directory")
    assert len(err) == 1


def test_generate_audio_out_into_a_missing_folder_fails_before_the_run(tmp_path, omni_toml):
    wav = tmp_path / "missing" / "dir" / "a.wav"
    code, err = omnix("generate", "hi", "--pipeline", omni_toml, "--audio-out", wav)
    one_line_error(code, err, "generate", f"--audio-out {wav}", "no folder")
    assert len(err) == 1  # no "starting workers..."


def test_replay_request_not_in_the_trace():
    code, err = omnix("replay", TRACE, "--request", "nosuch")
    one_line_error(code, err, "replay", "--request nosuch", "not in", TRACE.name)
    assert len(err) == 1


# -- more of the same, tried as a new user would ------------------------------------------


def test_replay_client_bytes_output_into_a_missing_folder(tmp_path):
    body = tmp_path / "missing" / "body"
    code, err = omnix("replay", TRACE, "--client-bytes", "-o", body)
    one_line_error(code, err, "replay", f"--output {body}", "cannot write it")


def test_replay_width_that_is_not_a_width():
    code, err = omnix("replay", TRACE, "--width", "-5")
    one_line_error(code, err, "replay", "--width", "-5")


def test_trace_info_of_a_directory(tmp_path):
    code, err = omnix("trace", "info", tmp_path)
    one_line_error(code, err, "trace info", str(tmp_path), "Is a directory")


def test_trace_export_output_into_a_folder_that_cannot_be_made(tmp_path):
    (tmp_path / "events").mkdir()
    (tmp_path / "pipeline.json").write_bytes(_pipeline_json())
    code, err = omnix("trace", "export", "--log-dir", tmp_path, "--all", "-o", "/proc/x/y.trace")
    one_line_error(code, err, "trace export", "--output /proc/x/y.trace", "cannot write it")


def _pipeline_json() -> bytes:
    import msgspec

    from omnix.trace import read_trace

    return msgspec.json.encode(read_trace(TRACE).pipeline)


def test_telemetry_trace_that_is_a_directory(tmp_path):
    code, err = omnix("telemetry", "--trace", tmp_path)
    one_line_error(code, err, "telemetry", str(tmp_path), "Is a directory")


def test_pipelines_show_a_directory(tmp_path):
    code, err = omnix("pipelines", "show", tmp_path)
    # A pipeline's problems are listed one a line, after the error line.
    assert code == 2 and not any("Traceback" in line for line in err), err
    assert err[0] == f"omnix pipelines show: error: invalid pipeline config {tmp_path}:"
    assert "cannot read it (Is a directory)" in err[1]


def test_worker_cpus_this_machine_does_not_have(tmp_path):
    code, err = omnix(
        "worker", "--connect", f"ipc://{tmp_path}/s.sock", "--stage", "thinker", "--cpus", "99999"
    )
    one_line_error(code, err, "worker", "CPUs '99999'", "this process may use CPUs")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--max-tokens", "0"), ("--max-tokens", "at least 1")),
        (("--seed", "-1"), ("--seed", "-1")),
        (("--outputs", "video"), ("'video'", "it produces: text, audio")),
        (("--log-dir", "/proc/x"), ("--log-dir /proc/x", "cannot keep the log there")),
        (("--image-out", "/proc/x/a.png", "--outputs", "text,image"), ("'image'",)),
    ],
)
def test_generate_bad_flags(omni_toml, flags, says):
    code, err = omnix("generate", "hi", "--pipeline", omni_toml, *flags)
    one_line_error(code, err, "generate", *says)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--port", "99999"), ("--port", "99999")),
        (("--workers-endpoint", "tcp://host"), ("--workers-endpoint", "'tcp://host'")),
        (("--log-dir", "/proc/x"), ("--log-dir /proc/x", "cannot keep the log there")),
        (("--max-batch", "0"), ("--max-batch", "at least 1")),
    ],
)
def test_serve_bad_flags(omni_toml, flags, says):
    code, err = omnix("serve", "--pipeline", omni_toml, "--port", "0", *flags)
    one_line_error(code, err, "serve", *says)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--standby",), ("--standby", "--log nats://")),
        (("--log", "http://127.0.0.1:4222"), ("--log http://127.0.0.1:4222", "nats://HOST:PORT")),
        (("--log", "nats://127.0.0.1:1", "--log-dir", "d"), ("--log and --log-dir",)),
        (("--log", "nats://127.0.0.1:1", "--lease-ttl", "0"), ("--lease-ttl",)),
    ],
)
def test_serve_bad_replicated_log_flags(omni_toml, flags, says):
    code, err = omnix("serve", "--pipeline", omni_toml, "--port", "0", *flags)
    one_line_error(code, err, "serve", *says)


@pytest.mark.parametrize("verb", ["serve", "frontend"])
def test_a_nats_url_nothing_answers_is_one_line_naming_it(omni_toml, verb):
    flags = ("--pipeline", str(omni_toml)) if verb == "serve" else ()
    code, err = omnix(verb, *flags, "--port", "0", "--log", "nats://127.0.0.1:1")
    one_line_error(code, err, verb, "nats://127.0.0.1:1", status=1)


def test_serve_no_build_without_the_models():
    code, err = omnix("serve", "--pipeline", "tiny-text", "--no-build", "--model-dir", "/proc/m")
    one_line_error(code, err, "serve", "tiny models thinker are missing in /proc/m")


def test_serve_a_pipeline_that_is_a_directory(tmp_path):
    code, err = omnix("serve", "--pipeline", tmp_path, "--port", "0")
    assert code == 2 and not any("Traceback" in line for line in err), err
    assert err[0] == f"omnix serve: error: invalid pipeline config {tmp_path}:"


def test_serve_config_file_value_checked_like_the_flag(tmp_path, omni_toml):
    cfg = tmp_path / "serve.toml"
    cfg.write_text("port = 99999\n")
    code, err = omnix("serve", "--pipeline", omni_toml, "--config", cfg)
    one_line_error(code, err, "serve", f"--config {cfg}", "port = 99999", "0 to 65535")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("log", "--events", "0"), ("--events", "at least 1")),
        (("log", "--dir", "/proc/x", "--events", "10"), ("--dir /proc/x", "cannot write")),
        (("hop", "--endpoint", "bogus"), ("--endpoint", "'bogus'")),
        (("replay", "--trace", "/nonexistent.trace"), ("--trace /nonexistent.trace",)),
        (("telemetry", "--rounds", "0"), ("--rounds", "at least 1")),
        (("http", "--streams", "0"), ("--streams", "at least 1")),
        (("media", "--pipeline", "nosuch"), ("invalid pipeline config nosuch",)),
        (("soak", "--requests", "0"), ("--requests",)),
        (("engines", "--levels", "0"), ("--levels", "'0'")),
        (("tts", "--levels", "1,128"), ("--levels '1,128'", "from 1 to 64")),
        (("tts", "--sizes", "tiny", "--levels", "x"), ("--levels 'x'", "not a list of counts")),
        (("tts", "--sizes", "real"), ("--sizes real needs --device cuda",)),
        (("speech", "--stages", "--levels", "64"), ("--levels '64'", "from 1 to 32")),
        (("duplex", "--sizes", "tiny", "--levels", "0"), ("--levels '0'", "give counts")),
        (("failover", "--runs", "0"), ("--runs must be >= 1",)),
        (("failover", "--pipeline", "tiny-omni"), ("--pipeline tiny-omni", "one stage")),
    ],
)
def test_bench_bad_flags(argv, says):
    name, *rest = argv
    code, err = omnix("bench", name, *rest)
    first = next(i for i, line in enumerate(err) if "error: " in line)
    one_line_error(code, err[: first + 1], f"bench {name}", *says)


# -- omnix serve PATH and vLLM's engine flags (issue 30): before any engine starts ------------


def test_serve_a_folder_that_does_not_exist(tmp_path):
    code, err = omnix("serve", tmp_path / "nope", "--port", "0")
    one_line_error(code, err, "serve", f"{tmp_path}/nope: no such folder", "never downloads")
    assert len(err) == 1


def test_serve_a_hugging_face_id_the_cache_does_not_hold(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, err = omnix("serve", "tiny-org/absent", "--port", "0")
    one_line_error(
        code, err, "serve", "tiny-org/absent is neither a local folder nor a model in the "
        f"Hugging Face cache ({tmp_path / 'hub'})", "`hf download tiny-org/absent`",
    )  # fmt: skip
    assert len(err) == 1


def test_serve_a_folder_with_no_config(tmp_path):
    code, err = omnix("serve", "--model", tmp_path, "--port", "0")
    one_line_error(code, err, "serve", str(tmp_path), "no config.json", "no model_index.json")
    assert len(err) == 1


def test_serve_an_architecture_nothing_here_serves(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen2ForCausalLMM"]}')
    code, err = omnix("serve", tmp_path, "--port", "0")
    last = one_line_error(
        code, err, "serve", "architecture Qwen2ForCausalLMM is not one omnix serves"
    )
    # what is served, listed: the table's rows
    for kind in ("Qwen3OmniMoeForConditionalGeneration", "text-to-image", "vLLM serves"):
        assert kind in last
    assert "near: Qwen2ForCausalLM" in last and len(err) == 1


def test_serve_a_flag_vllm_does_not_know(tiny_models):
    code, err = omnix("serve", tiny_models.thinker, "--max-model-lenn", "256")
    one_line_error(
        code, err, "serve", "unrecognized arguments: --max-model-lenn 256",
        "neither omnix's nor one of vLLM's engine flags", "did you mean --max-model-len?",
    )  # fmt: skip
    assert len(err) == 1


def test_serve_a_value_vllms_parser_refuses(tiny_models):
    code, err = omnix("serve", tiny_models.thinker, "--dtype", "fp7")
    one_line_error(code, err, "serve", "argument --dtype: invalid choice: 'fp7'")


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--tensor-parallel-size", "0"), ("tensor_parallel_size", "greater than or equal to 1")),
        (("--quantization", "bogus"), ("Unknown quantization method: bogus",)),
        (("--max-model-len", "100000"), ("max_model_len (100000) is greater than the derived",)),
    ],
)
def test_serve_a_value_vllm_refuses_in_its_own_words(tiny_models, flags, says):
    code, err = omnix("serve", tiny_models.thinker, "--port", "0", *flags)
    one_line_error(code, err, "serve", "stage 'llm': vLLM refuses it: ", *says)
    assert len(err) == 1  # before any engine started: no worker wrote a line


def test_serve_devices_that_are_not_devices(tiny_models):
    code, err = omnix("serve", tiny_models.thinker, "--port", "0", "--stage-devices", "llm=0,x")
    assert code == 2 and "devices '0,x' is not a list of GPU numbers" in "\n".join(err), err
    code, err = omnix("serve", tiny_models.thinker, "--port", "0", "--stage-devices", "talker=0")
    one_line_error(code, err, "serve", "--stage-devices 'talker=0'", "(llm)")


def test_serve_a_pipeline_file_whose_engine_args_vllm_does_not_have(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        'name = "p"\n[[stages]]\nname = "thinker"\n'
        'engine = { kind = "vllm", model = "thinker", engine_args = { max_modl_len = 64 } }\n'
        '[outputs]\ntext = "thinker"\n'
    )
    code, err = omnix("serve", "--pipeline", path, "--port", "0")
    assert code == 2 and not any("Traceback" in line for line in err), err
    assert "stage 'thinker': engine_args.max_modl_len is not one of vLLM" in err[-1]
    assert "did you mean max_model_len?" in err[-1]


def test_serve_engine_flags_for_a_pipeline_without_a_vllm_stage(omni_toml):
    code, err = omnix("serve", "--pipeline", omni_toml, "--port", "0", "--max-model-len", "64")
    one_line_error(code, err, "serve", "--max-model-len", "the pipeline has no vLLM stage")


def test_serve_a_folder_and_a_pipeline(tiny_models, omni_toml):
    code, err = omnix("serve", tiny_models.thinker, "--pipeline", omni_toml)
    one_line_error(code, err, "serve", "give one", "omnix pipelines show --model PATH")


def test_serve_a_cache_that_is_not_one_names_the_kinds():
    code, err = omnix("serve", "--pipeline", "tiny-image", "--port", "0", "--cache", "teacache")
    one_line_error(code, err, "serve", "--cache 'teacache'", "first_block, taylorseer")
    code, err = omnix("serve", "--pipeline", "tiny-text", "--port", "0", "--cache", "first_block")
    one_line_error(code, err, "serve", "the pipeline has no diffusion stage")


def test_validate_a_cache_option_diffusers_does_not_have(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        'name = "p"\n[[stages]]\nname = "image"\n'
        'engine = { kind = "diffusers", model = "image", cache = { kind = "first_block", '
        "treshold = 0.1 } }\n"
        '[outputs]\nimage = "image"\n'
    )
    code, err = omnix("pipelines", "validate", path)
    assert (
        code == 1 and "unknown field `treshold`" in err[-1] and "first_block: threshold" in err[-1]
    )


def test_serve_a_cache_the_pipeline_family_does_not_run_names_the_kinds_that_do(tiny_models):
    code, err = omnix("serve", "--pipeline", "tiny-video", "--port", "0", "--cache", "taylorseer")
    one_line_error(
        code, err, "serve", "stage 'video': engine.cache: taylorseer does not run on WanPipeline",
        "the kinds that do: first_block, pyramid_attention_broadcast",
    )  # fmt: skip


def test_serve_cfg_batch_on_a_family_omnix_does_not_batch_names_the_one_it_does(tmp_path):
    folder = tmp_path / "sd3"
    folder.mkdir()
    (folder / "model_index.json").write_text('{"_class_name": "StableDiffusion3Pipeline"}')
    pipeline = tmp_path / "sd3.toml"
    pipeline.write_text(
        'name = "sd3"\n[[stages]]\nname = "image"\n'
        f'engine = {{ kind = "diffusers", model = "{folder}" }}\n[outputs]\nimage = "image"\n'
    )
    code, err = omnix("serve", "--pipeline", str(pipeline), "--port", "0", "--cfg-batch", "on")
    assert code == 2 and err == [
        "omnix serve: error: invalid pipeline config (as served):",
        "  - stage 'image': engine.cfg_batch: omnix batches the two guidance forwards of "
        "FluxPipeline, WanPipeline only, not StableDiffusion3Pipeline's; remove cfg_batch "
        "(or set it false)",
    ]
    code, err = omnix("serve", "--pipeline", "tiny-video", "--port", "0", "--cfg-batch", "x:off")
    one_line_error(code, err, "serve", "--cfg-batch 'x:off': 'x' is not a diffusion stage")


def test_serve_compile_reaches_the_diffusion_stages_and_is_refused_whole_model_with_a_cache():
    code, err = omnix(
        "serve", "--pipeline", "tiny-image", "--port", "0", "--compile", "model",
        "--cache", "first_block",
    )  # fmt: skip
    assert code == 2 and err == [
        "omnix serve: error: invalid pipeline config (as served):",
        "  - stage 'image': engine.compile = 'model' with engine.cache (first_block): the "
        "cache's step-dependent branches break a whole-model graph; use compile = 'blocks'",
    ]
    code, err = omnix("serve", "--pipeline", "tiny-image", "--port", "0", "--compile", "fast")
    one_line_error(code, err, "serve", "--compile 'fast': give [STAGE:]off, [STAGE:]blocks")
    code, err = omnix("serve", "--pipeline", "tiny-video", "--port", "0", "--compile", "x:blocks")
    one_line_error(code, err, "serve", "--compile 'x:blocks': 'x' is not a diffusion stage")


def test_bench_diffusion_at_real_sizes_wants_a_gpu():
    code, err = omnix("bench", "diffusion", "--sizes", "real")
    one_line_error(code, err, "bench diffusion", "--sizes real", "give --device cuda")
