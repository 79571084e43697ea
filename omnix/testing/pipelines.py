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
