"""omnix's streaming Mimi encode held to transformers' ``MimiModel.encode``
of the whole audio, on the tiny Moshi's Mimi: 24 kHz PCM fed 80 ms at a time
(or a few frames at a time) gives every frame's codes equal to the whole
clip's encode, all codebooks, the first frame and the last included; a
stream refuses what is not whole frames of mono PCM."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from omnix.engines.duplex_model import DuplexModel
from omnix.engines.mimi_stream import MimiEncodeStream
from omnix.models.moshi import write_folder

pytestmark = pytest.mark.engines

K = 8
FRAME = 1920


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> DuplexModel:
    out = tmp_path_factory.mktemp("moshi") / "moshi"
    write_folder(out, seed=0)
    return DuplexModel.load(Path(out))


def _audio(kind: str, frames: int):
    import torch

    n = frames * FRAME
    t = torch.arange(n) / 24000
    if kind == "chirp":
        return 0.3 * torch.sin(2 * math.pi * (180 + 250 * t) * t)
    if kind == "voice":
        f0 = 140 + 20 * torch.sin(2 * math.pi * 5 * t)
        phase = 2 * math.pi * torch.cumsum(f0, 0) / 24000
        voice = sum(torch.sin(h * phase) / h for h in range(1, 6))
        return 0.2 * voice * (0.5 + 0.5 * torch.sin(2 * math.pi * 3 * t).clamp(min=0))
    if kind == "noise":
        return 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(3))
    return torch.zeros(n)


def _whole(model: DuplexModel, audio):
    import torch

    with torch.inference_mode():
        return model.mimi.encode(audio[None, None], num_quantizers=K)[0][0]


@pytest.mark.parametrize("kind", ["chirp", "voice", "noise", "silence"])
def test_frames_encoded_one_at_a_time_are_the_whole_clips_codes(
    model: DuplexModel, kind: str
) -> None:
    import torch

    audio = _audio(kind, 40)
    stream = MimiEncodeStream(model.mimi, K)
    state = stream.start()
    codes = torch.cat(
        [stream.encode(state, audio[i * FRAME : (i + 1) * FRAME]) for i in range(40)], dim=1
    )
    whole = _whole(model, audio)
    assert whole.shape == (K, 40)
    assert torch.equal(codes, whole)
    assert state.frames == 40


def test_frames_encoded_in_uneven_groups_are_the_whole_clips_codes(model: DuplexModel) -> None:
    import torch

    audio = _audio("voice", 12)
    stream = MimiEncodeStream(model.mimi, K)
    state = stream.start()
    parts, at = [], 0
    for n in (1, 3, 2, 5, 1):
        parts.append(stream.encode(state, audio[at * FRAME : (at + n) * FRAME]))
        at += n
    assert torch.equal(torch.cat(parts, dim=1), _whole(model, audio))


def test_two_streams_carry_their_own_state(model: DuplexModel) -> None:
    import torch

    a, b = _audio("chirp", 6), _audio("noise", 6)
    stream = MimiEncodeStream(model.mimi, K)
    sa, sb = stream.start(), stream.start()
    out_a, out_b = [], []
    for i in range(6):
        out_a.append(stream.encode(sa, a[i * FRAME : (i + 1) * FRAME]))
        out_b.append(stream.encode(sb, b[i * FRAME : (i + 1) * FRAME]))
    assert torch.equal(torch.cat(out_a, 1), _whole(model, a))
    assert torch.equal(torch.cat(out_b, 1), _whole(model, b))


def test_what_is_not_whole_frames_of_mono_pcm_is_refused(model: DuplexModel) -> None:
    import torch

    stream = MimiEncodeStream(model.mimi, K)
    state = stream.start()
    for bad in (torch.zeros(FRAME - 1), torch.zeros(0), torch.zeros(2, FRAME)):
        with pytest.raises(ValueError, match="whole frames of 1920 mono samples"):
            stream.encode(state, bad)
    assert state.frames == 0
