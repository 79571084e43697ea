"""Scripted pipelines of tiny-omni's shape, for tests and benches.

Owns: ``scripted_omni_toml``/``scripted_omni``, thinker -> talker ->
code2wav on scripted engines (text, codec frames, audio), with async chunk
forwarding, and a small override syntax so each test states only what it
changes.  Scripted engines are test engines: nothing here is a product
default.

Overrides name a table: a stage (``thinker``, ``talker``, ``code2wav``) or
the edge leaving a stage (``edge_thinker``, ``edge_talker``); the value is
TOML ``key = value`` lines, each replacing that key in the table or adding
it.  For example ``scripted_omni(talker="replicas = 2\\nretry = true")``.
"""

from __future__ import annotations

from omnix.pipelines.config import PipelineConfig

SCRIPTED_OMNI = """
name = "scripted-omni"
[[stages]]
name = "thinker"
engine = { kind = "scripted", chunks_per_piece = 12, delay_ms = 2 }
[[stages]]
name = "talker"
engine = { kind = "scripted", chunks_per_piece = 3, delay_ms = 1, output_modality = "codec" }
[[stages]]
name = "code2wav"
engine = { kind = "scripted", chunks_per_piece = 1, delay_ms = 1, output_modality = "audio" }
[[edges]]
source = "thinker"
target = "talker"
forward = "sentence"
[[edges]]
source = "talker"
target = "code2wav"
forward = "chunk"
every = 2
[outputs]
text = "thinker"
audio = "code2wav"
"""


def scripted_omni_toml(name: str = "scripted-omni", **overrides: str) -> str:
    """The pipeline's TOML text, named ``name``, with ``overrides`` applied."""
    text = SCRIPTED_OMNI.replace('name = "scripted-omni"', f'name = "{name}"', 1)
    blocks = text.split("[[")
    for table, extra in overrides.items():
        if table.startswith("edge_"):
            kind, marker = "edges]]", f'source = "{table[5:]}"\n'
        else:
            kind, marker = "stages]]", f'name = "{table}"\n'
        for i, block in enumerate(blocks):
            if block.startswith(kind) and marker in block:
                blocks[i] = _override(block, extra)
                break
        else:
            raise ValueError(
                f"no table {table!r} to override (stages: thinker, talker, code2wav; "
                "edges: edge_thinker, edge_talker)"
            )
    return "[[".join(blocks)


def scripted_omni(name: str = "scripted-omni", **overrides: str) -> PipelineConfig:
    """The parsed and validated pipeline (see ``scripted_omni_toml``)."""
    from omnix.pipelines.validate import parse_pipeline

    return parse_pipeline(scripted_omni_toml(name, **overrides))


def _override(block: str, extra: str) -> str:
    # The [outputs] table follows the last edge in the same block: keep it
    # after the edge's lines.
    head, sep, tail = block.partition("[outputs]")
    lines = head.rstrip("\n").split("\n")
    for new in extra.strip().split("\n"):
        key = new.split("=")[0].strip()
        lines = [ln for ln in lines if ln.split("=")[0].strip() != key]
        lines.append(new)
    return "\n".join(lines) + "\n" + sep + tail


#: The speech path of tiny-omni before Qwen3-Omni's own talker and Code2Wav
#: served it: the thinker, then a small Qwen2 LM over the thinker's text ids
#: on vLLM (``talker``) and omnix's toy codec (``code2wav``).  A test
#: pipeline only: it is where a *later* stage runs on vLLM (what tests of
#: vLLM's own aborts in a downstream stage need).  Nothing about its audio
#: says anything about Qwen3-Omni's.
STANDIN_OMNI = """
name = "standin-omni"
[[stages]]
name = "thinker"
engine = { kind = "vllm", model = "omni_thinker", max_model_len = 2048, kv_cache_gib = 0.25, limit_mm_per_prompt = { audio = 1, image = 1, video = 0 } }
sampling = { temperature = 0.8, top_p = 0.95, max_tokens = 32 }
[[stages]]
name = "talker"
engine = { kind = "vllm", model = "talker", input_mode = "token_ids", output_modality = "codec", kv_cache_gib = 0.25 }
sampling = { temperature = 0.9, max_tokens = 64 }
[[stages]]
name = "code2wav"
engine = { kind = "codec", model = "code2wav" }
[[edges]]
source = "thinker"
target = "talker"
forward = "sentence"
every = 8
[[edges]]
source = "talker"
target = "code2wav"
forward = "chunk"
every = 8
[outputs]
text = "thinker"
audio = "code2wav"
"""


def standin_omni() -> PipelineConfig:
    """``STANDIN_OMNI``, parsed and validated."""
    from omnix.pipelines.validate import parse_pipeline

    return parse_pipeline(STANDIN_OMNI)


#: Two scripted stages for the Ray placement's tests and bench: a thinker
#: pinned by the custom resource ``thinker_node``, a decoder (audio) by
#: ``{decoder}`` (``decoder_node`` unless told), ``{replicas}`` decoders.
RAY_TWO_STAGES = """
name = "ray-two"
[[stages]]
name = "thinker"
engine = {{ kind = "scripted", chunks_per_piece = 24, delay_ms = 40 }}
placement = {{ num_cpus = 0.5, resources = {{ thinker_node = 1 }} }}
[[stages]]
name = "decoder"
engine = {{ kind = "scripted", chunks_per_piece = 1, output_modality = "audio", delay_ms = 40 }}
placement = {{ num_cpus = 0.5, resources = {{ {decoder} = 1 }} }}
replicas = {replicas}
[[edges]]
source = "thinker"
target = "decoder"
forward = "chunk"
every = 4
[outputs]
text = "thinker"
audio = "decoder"
"""


def ray_two_stages_toml(decoder: str = "decoder_node", replicas: int | str = 1) -> str:
    """The two-stage pipeline the Ray tests place; ``replicas``: the
    decoder's (a count, or a range table as TOML)."""
    return RAY_TWO_STAGES.format(decoder=decoder, replicas=replicas)
