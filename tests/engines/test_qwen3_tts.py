"""omnix's Qwen3-TTS held to the reference, ``qwen-tts`` 0.1.1, on the tiny
CustomVoice, VoiceDesign and Base (voice cloning) checkpoints: the
reference's own greedy ``generate_custom_voice`` / ``generate_voice_design``
/ ``generate_voice_clone`` runs in its environment (``.venv-ref``,
scripts/reference-env.sh: it pins transformers 4.57.3) as a subprocess
(``omnix.testing.qwen3_tts_oracle``), omnix's talker and speech decoder
here; the codes must be equal in all 16 groups of every frame, and omnix's
waveform for those codes equal to the reference decoder's, sample for
sample; for Base also the speaker vector and the reference audio's codes.
Never skipped in CI (OMNIX_REQUIRE_ALL=1): without the reference
environment these tests skip, which fails there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from omnix.models.paths import ModelPaths
from omnix.testing.qwen3_tts_oracle import ReferenceMissing, run_reference

MAX_NEW_TOKENS = 24

#: What each case asks (SpeechRequest's fields, plus the frame budget).
CASES: dict[str, dict] = {
    "named speaker": {"text": "Hello there, how are you today?", "speaker": "Vivian"},
    "named speaker and language": {
        "text": "The quick brown fox.",
        "speaker": "ryan",
        "language": "English",
    },
    "instruction": {
        "text": "Speak softly, please.",
        "speaker": "Aiden",
        "instruct": "Very happy, and a little fast.",
    },
    "dialect speaker": {"text": "One two three.", "speaker": "Eric", "language": "Chinese"},
    "text one token a frame": {
        "text": "Streaming text in, one token a frame.",
        "speaker": "sohee",
        "non_streaming": False,
    },
}


def _long_codes():
    import torch

    gen = torch.Generator().manual_seed(40)
    return torch.randint(0, 2048, (330, 16), generator=gen)


@pytest.fixture(scope="module")
def folder(tiny_models: ModelPaths) -> Path:
    return Path(tiny_models.qwen3_tts_custom_voice)


def _run_reference(folder: Path, cases: list[dict], tmp: Path) -> dict:
    """The reference's run over ``cases`` in one process (~20 s)."""
    try:
        return run_reference(folder, cases, tmp)
    except ReferenceMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def reference(folder: Path, tmp_path_factory) -> dict:
    cases: list[dict] = [{**c, "max_new_tokens": MAX_NEW_TOKENS} for c in CASES.values()]
    cases.append({"decode": _long_codes().tolist()})
    data = _run_reference(folder, cases, tmp_path_factory.mktemp("qwen3-tts-reference"))
    data["by_case"] = dict(zip(CASES, data["results"][: len(CASES)], strict=True))
    data["decoded"] = data["results"][len(CASES)]
    return data


@pytest.fixture(scope="module")
def omnix_tts(folder: Path):
    import torch

    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker
    from omnix.engines.speech_decoder import SpeechCodec

    torch.set_num_threads(1)
    return Qwen3TTSTalker.load(folder), SpeechCodec.load(folder)


def test_the_reference_loads_the_tiny_checkpoint_with_no_missing_or_unexpected_tensor(
    reference: dict,
) -> None:
    assert reference["keys"] == {
        "model": {"missing": [], "unexpected": []},
        "speech_tokenizer": {"missing": [], "unexpected": []},
    }


@pytest.mark.parametrize("case", list(CASES))
def test_codes_equal_the_reference_in_every_group_of_every_frame(
    case: str, reference: dict, omnix_tts
) -> None:
    import torch

    from omnix.engines.qwen3_tts_talker import SpeechRequest

    talker, _ = omnix_tts
    theirs = torch.tensor(reference["by_case"][case]["codes"])
    ours = talker.generate(SpeechRequest(**CASES[case]), MAX_NEW_TOKENS)
    assert theirs.shape[1] == 16 and len(theirs) > 2
    assert ours.shape == theirs.shape
    assert torch.equal(ours, theirs), (ours != theirs).nonzero()[:5]


@pytest.mark.parametrize("case", list(CASES))
def test_the_waveform_equals_the_reference_decoders_for_those_codes(
    case: str, reference: dict, omnix_tts
) -> None:
    import torch

    _, codec = omnix_tts
    result = reference["by_case"][case]
    codes = torch.tensor(result["codes"])
    theirs = torch.tensor(result["wav"], dtype=torch.float32)
    ours = codec.decode(codes)
    assert result["sample_rate"] == codec.sample_rate == 24000
    assert ours.shape == theirs.shape == (len(codes) * 1920,)
    assert torch.equal(ours, theirs), (ours - theirs).abs().max()
    assert float(ours.abs().max()) > 0.05  # audible, not the silence of zero codebooks


def test_a_long_utterance_decodes_in_the_reference_chunks_to_its_samples(
    reference: dict, omnix_tts
) -> None:
    """330 frames: two chunks of the reference's 300, the second with 25
    frames of left context whose samples are cut off again."""
    import torch

    _, codec = omnix_tts
    result = reference["decoded"]
    codes = torch.tensor(result["codes"])
    theirs = torch.tensor(result["wav"], dtype=torch.float32)
    ours = codec.decode(codes)
    assert ours.shape == theirs.shape == (330 * 1920,)
    assert torch.equal(ours, theirs), (ours - theirs).abs().max()


def test_an_unknown_voice_or_language_is_refused_naming_what_the_checkpoint_has(omnix_tts) -> None:
    from omnix.engines.qwen3_tts_talker import SpeechRequest

    talker, _ = omnix_tts
    with pytest.raises(ValueError, match=r"unknown voice 'nobody'.*vivian"):
        talker.prompt(SpeechRequest(text="hi", speaker="nobody"))
    with pytest.raises(ValueError, match=r"unknown language 'klingon'.*english"):
        talker.prompt(SpeechRequest(text="hi", speaker="vivian", language="klingon"))


def test_a_folder_with_a_tensor_the_talker_lacks_is_refused(folder: Path, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    weights = load_file(str(copy / "model.safetensors"))
    weights["talker.extra.weight"] = weights["talker.codec_head.weight"].clone()
    save_file(weights, str(copy / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected \['extra.weight'\]"):
        Qwen3TTSTalker.load(copy)


#: VoiceDesign: no named speakers, the voice from a description.
DESIGN_CASES: dict[str, dict] = {
    "designed voice": {
        "text": "A voice made of words.",
        "instruct": "A deep, calm old man's voice, speaking slowly.",
    },
    "designed voice and language": {
        "text": "Guten Morgen.",
        "instruct": "A bright young woman.",
        "language": "German",
    },
}


@pytest.fixture(scope="module")
def design(tiny_models: ModelPaths, tmp_path_factory):
    """(folder, the reference's run, omnix's talker and decoder) for the
    tiny VoiceDesign checkpoint."""
    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker
    from omnix.engines.speech_decoder import SpeechCodec

    folder = Path(tiny_models.qwen3_tts_voice_design)
    cases = [{**c, "max_new_tokens": MAX_NEW_TOKENS} for c in DESIGN_CASES.values()]
    data = _run_reference(folder, cases, tmp_path_factory.mktemp("qwen3-tts-design"))
    return data, Qwen3TTSTalker.load(folder), SpeechCodec.load(folder)


@pytest.mark.parametrize("case", list(DESIGN_CASES))
def test_a_designed_voice_equals_the_reference_in_codes_and_samples(case: str, design) -> None:
    import torch

    from omnix.engines.qwen3_tts_talker import SpeechRequest

    data, talker, codec = design
    assert data["keys"] == {
        "model": {"missing": [], "unexpected": []},
        "speech_tokenizer": {"missing": [], "unexpected": []},
    }
    result = dict(zip(DESIGN_CASES, data["results"], strict=True))[case]
    theirs = torch.tensor(result["codes"])
    ours = talker.generate(SpeechRequest(**DESIGN_CASES[case]), MAX_NEW_TOKENS)
    assert theirs.shape[1] == 16 and len(theirs) > 2
    assert torch.equal(ours, theirs), (ours != theirs).nonzero()[:5]
    wav = codec.decode(theirs)
    assert torch.equal(wav, torch.tensor(result["wav"], dtype=torch.float32))


#: Base: a voice cloned from a reference WAV the test writes, with its
#: transcript (ICL: the reference codes and text in the prompt) or from the
#: speaker vector alone.
REF_TEXT = "A sweeping tone, then a bell."
CLONE_CASES: dict[str, dict] = {
    "reference audio and its text": {"text": "Clone this voice, please.", "ref_text": REF_TEXT},
    "reference audio and its text, text a token a frame": {
        "text": "Say it one token at a time.",
        "ref_text": REF_TEXT,
        "non_streaming": False,
        "language": "English",
    },
    "the speaker vector alone": {"text": "Only the vector.", "x_vector_only": True},
}


def _write_reference_wav(path: Path, seconds: float = 1.3, rate: int = 24000) -> None:
    """A gliding tone and a tremolo bell, 16-bit PCM at 24 kHz."""
    import numpy as np
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    x = 0.4 * np.sin(2 * np.pi * 220 * t * (1 + 0.3 * t))
    x += 0.2 * np.sin(2 * np.pi * 523 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    sf.write(str(path), x, rate, subtype="PCM_16")


@pytest.fixture(scope="module")
def cloned(tiny_models: ModelPaths, tmp_path_factory):
    """(the reference's run, omnix's cloner, talker and decoder, the WAV)
    for the tiny Base checkpoint."""
    from omnix.engines.qwen3_tts_clone import VoiceCloner
    from omnix.engines.qwen3_tts_talker import Qwen3TTSTalker
    from omnix.engines.speech_decoder import SpeechCodec

    folder = Path(tiny_models.qwen3_tts_base)
    tmp = tmp_path_factory.mktemp("qwen3-tts-base")
    wav = tmp / "reference.wav"
    _write_reference_wav(wav)
    cases = [
        {**c, "ref_audio": str(wav), "max_new_tokens": MAX_NEW_TOKENS} for c in CLONE_CASES.values()
    ]
    data = _run_reference(folder, cases, tmp)
    data["by_case"] = dict(zip(CLONE_CASES, data["results"], strict=True))
    talker = Qwen3TTSTalker.load(folder)
    return data, VoiceCloner.load(folder), talker, SpeechCodec.load(folder), wav


def _clone(cloned, case: str):
    from omnix.engines.qwen3_tts_clone import read_wav

    _, cloner, _, _, wav = cloned
    samples, rate = read_wav(wav)
    return cloner.clone(samples, rate, CLONE_CASES[case].get("ref_text"))


def test_the_reference_loads_the_tiny_base_checkpoint_with_no_missing_or_unexpected_tensor(
    cloned,
) -> None:
    assert cloned[0]["keys"] == {
        "model": {"missing": [], "unexpected": []},
        "speech_tokenizer": {"missing": [], "unexpected": []},
    }


@pytest.mark.parametrize("case", list(CLONE_CASES))
def test_the_speaker_vector_and_reference_codes_equal_the_references(case: str, cloned) -> None:
    import torch

    result = cloned[0]["by_case"][case]
    voice = _clone(cloned, case)
    assert voice.speaker.shape == (64,)
    assert torch.equal(voice.speaker, torch.tensor(result["speaker"], dtype=torch.float32))
    if CLONE_CASES[case].get("x_vector_only"):
        assert voice.codes is None and result["ref_codes"] is None
        return
    theirs = torch.tensor(result["ref_codes"])
    assert theirs.shape == (17, 16)  # ceil(1.3 s x 12.5 frames a second)
    assert len(set(theirs[:, 0].tolist())) > 4  # the tiny encoder's codes vary
    assert torch.equal(voice.codes, theirs), (voice.codes != theirs).nonzero()[:5]


@pytest.mark.parametrize("case", list(CLONE_CASES))
def test_a_cloned_voice_equals_the_reference_in_codes_and_samples(case: str, cloned) -> None:
    import torch

    from omnix.engines.qwen3_tts_talker import SpeechRequest

    data, _, talker, codec, _ = cloned
    result = data["by_case"][case]
    voice = _clone(cloned, case)
    fields = {k: v for k, v in CLONE_CASES[case].items() if k not in ("ref_text", "x_vector_only")}
    ours = talker.generate(SpeechRequest(**fields, clone=voice), MAX_NEW_TOKENS)
    theirs = torch.tensor(result["codes"])
    assert theirs.shape[1] == 16 and len(theirs) > 2
    assert ours.shape == theirs.shape
    assert torch.equal(ours, theirs), (ours != theirs).nonzero()[:5]
    # The reference decodes the reference codes and the new ones as one
    # utterance and cuts the reference's share off.
    wav = codec.decode(ours) if voice.codes is None else codec.decode_after(voice.codes, ours)
    reference_wav = torch.tensor(result["wav"], dtype=torch.float32)
    assert wav.shape == reference_wav.shape == (len(ours) * 1920,)
    assert torch.equal(wav, reference_wav), (wav - reference_wav).abs().max()
    assert float(wav.abs().max()) > 0.05


def test_cloning_is_refused_off_base_and_at_another_rate(omnix_tts, cloned) -> None:
    import torch

    from omnix.engines.qwen3_tts_talker import SpeechRequest

    talker, _ = omnix_tts  # CustomVoice
    voice = _clone(cloned, "the speaker vector alone")
    with pytest.raises(ValueError, match="needs a Base checkpoint"):
        talker.prompt(SpeechRequest(text="hi", clone=voice))
    with pytest.raises(ValueError, match="16000 Hz"):
        cloned[1].clone(torch.zeros(16000), 16000)
