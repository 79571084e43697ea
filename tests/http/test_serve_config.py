"""``omnix serve --config FILE``: flags from a file, the command line winning,
a bad key named."""

from __future__ import annotations

import argparse
import re

import pytest

from omnix.http.serve import add_arguments
from omnix.http.serve_config import ConfigError, apply_config, defaults_of


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_a_config_file_sets_flags_the_command_line_did_not(tmp_path):
    cfg = tmp_path / "serve.toml"
    cfg.write_text(
        'retain-requests = "200"\nretain = "30s"\nmax_batch = 8\naccess-log = true\nport = 9000\n'
    )
    args = _serve_args("--config", str(cfg), "--port", "8123")
    apply_config(args, args._serve_options, cfg)
    assert (args.retain_requests, args.retain, args.max_batch, args.access_log) == (
        "200",
        "30s",
        8,
        True,
    )
    assert args.port == 8123, "the command line wins"
    yml = tmp_path / "serve.yaml"
    yml.write_text("retain-bytes: 64MB\narchive: false\n")
    args = _serve_args()
    apply_config(args, args._serve_options, yml)
    assert (args.retain_bytes, args.archive) == ("64MB", False)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("retian = '10m'", "unknown option 'retian' (options: "),
        ("access-log = 'yes'", "access-log is a switch: give true or false"),
        ("max-batch = 'lots'", "max-batch = 'lots': invalid literal"),
        ("port = [1, 2]", "port takes one value"),
        ("= broken", "not valid toml"),
    ],
)
def test_a_bad_config_file_names_the_key(tmp_path, text, says):
    cfg = tmp_path / "serve.toml"
    cfg.write_text(text)
    args = _serve_args()
    with pytest.raises(ConfigError, match=re.escape(says)):
        apply_config(args, args._serve_options, cfg)


def test_a_config_file_takes_vllms_engine_flags(tmp_path):
    """As ``vllm serve --config`` takes them: by vLLM's names, read as its
    command line reads them, the command line winning."""
    pytest.importorskip("vllm")
    from omnix.http.serve_pipeline import engine_flags
    from omnix.pipelines.vllm_args import add_engine_flags

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dests = add_engine_flags(parser)
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        "model: /models/x\nmax-model-len: 8k\nserved_model_name: [a, b]\nenforce-eager: false\n"
        "seed: 3\n"
    )
    args = parser.parse_args(["--seed", "9"])
    apply_config(args, defaults_of(parser), cfg, frozenset(dests))
    assert args.model == "/models/x"
    args._vllm_dests = dests
    assert engine_flags(args) == {
        "max_model_len": 8000,
        "served_model_name": ["a", "b"],
        "enforce_eager": False,
        "seed": 9,  # the command line wins
    }
    bad = tmp_path / "bad.toml"
    bad.write_text("max-model-len = 'lots'\n")
    with pytest.raises(ConfigError, match=re.escape("max-model-len = 'lots'")):
        apply_config(parser.parse_args([]), defaults_of(parser), bad, frozenset(dests))
