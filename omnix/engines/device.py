"""Choosing the torch device an engine loads its model onto.

Owns: ``pick_device``, shared by the engines that place a torch model
themselves (codec, diffusers).  Does not own vLLM's placement: vLLM picks
its platform itself.
"""

from __future__ import annotations


def pick_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; any other
    name as given, refusing a ``cuda`` device that torch cannot see."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(
            f"device {device!r} asked for but torch sees no CUDA GPU: use 'auto' or 'cpu'"
        )
    return device
