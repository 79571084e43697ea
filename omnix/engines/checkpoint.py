"""Reading parts of a Hugging Face checkpoint without loading the rest.

Owns: ``tensors_under`` (the tensors whose names start with a prefix, from
every safetensors shard of a folder), ``load_exact`` (a module loaded from
them, none missing or left over) and ``fused_experts`` (hub-layout MoE
tensors, one per expert, fused the way transformers' modules keep them).
The stages of a multi-part model (Qwen3-Omni's talker and Code2Wav) each
load only their part of one checkpoint with these.  Does not own any
module or what runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import torch

M = TypeVar("M", bound="torch.nn.Module")


def tensors_under(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor of ``folder``'s safetensors shards named ``prefix...``,
    keyed by the rest of its name."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for shard in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # safe_open has no __contains__ / items
                if name.startswith(prefix):
                    out[name[len(prefix) :]] = f.get_tensor(name)
    return out


def fused_experts(
    raw: dict[str, torch.Tensor], wanted: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``raw`` (hub layout: ``...experts.E.{gate,up,down}_proj.weight``) in
    the layout of ``wanted`` (a module's ``state_dict``): transformers keeps
    ``experts.gate_up_proj`` [E, 2I, H] (gate rows first) and
    ``experts.down_proj`` [E, H, I].  Raises on a tensor ``wanted`` lacks."""
    import torch

    raw = dict(raw)
    out: dict[str, torch.Tensor] = {}
    for name, like in wanted.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name.removesuffix("gate_up_proj")
            out[name] = torch.stack(
                [
                    torch.cat(
                        [
                            raw.pop(f"{base}{e}.gate_proj.weight"),
                            raw.pop(f"{base}{e}.up_proj.weight"),
                        ]
                    )
                    for e in range(like.shape[0])
                ]
            )
        elif name.endswith("mlp.experts.down_proj"):
            base = name.removesuffix("down_proj")
            out[name] = torch.stack(
                [raw.pop(f"{base}{e}.down_proj.weight") for e in range(like.shape[0])]
            )
        elif name in raw:
            out[name] = raw.pop(name)
    if raw:
        raise ValueError(f"tensors the module has no place for: {sorted(raw)[:5]}")
    return out


def load_exact(module: M, folder: Path, prefix: str, what: str) -> M:
    """``module`` with every ``prefix...`` tensor of ``folder`` loaded, in
    eval mode; a tensor ``module`` lacks, or one it has that the folder
    lacks, is refused naming the first few (``what``: the module's name)."""
    weights = tensors_under(folder, prefix)
    expected = set(module.state_dict())
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise ValueError(
            f"{folder}'s {prefix}* tensors do not match the {what}: "
            f"missing {missing[:6]}, unexpected {unexpected[:6]}"
        )
    module.load_state_dict(weights, strict=True)
    return module.eval()
