"""Choosing the torch device an engine loads its model onto, and the CUDA
stream its thread runs on.

Owns: ``pick_device``, shared by the engines that place a torch model
themselves (codec, diffusers, talker), and ``use_own_stream``.  Does not
own vLLM's placement: vLLM picks its platform itself.
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


def use_own_stream(device: str, *, urgent: bool = False) -> None:
    """On a CUDA ``device``, the calling thread's work goes to a stream of
    its own from here on (torch's current stream is per thread); elsewhere
    nothing.  Engines sharing a process and a GPU (a talker and Code2Wav)
    then overlap there instead of queueing behind each other on the
    default stream.  ``urgent``: the stream's kernels are scheduled first
    (the talker's step, which every frame waits on)."""
    if not device.startswith("cuda"):
        return
    import torch

    # torch's priorities: 0 the default, a negative number a higher one.
    stream = torch.cuda.Stream(device=device, priority=-1 if urgent else 0)
    torch.cuda.set_stream(stream)
