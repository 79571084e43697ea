"""omnix's full-duplex Moshi engine held to transformers' own Moshi
(``MoshiForConditionalGeneration``, transformers 5.19) on the tiny
checkpoint, greedy:

- with the user silent, omnix's ticks are ``generate``'s frames, text token
  and all eight codebooks of every frame (generate feeds Mimi's codes of
  silence as the user's audio after its prompt);
- with user audio as generate's prompt (its ``user_audio_codes``, Moshi's
  side given), omnix's session started with that prompt, or fed it as
  forced ticks, continues exactly as generate does;
- with user audio streaming in the whole time (which generate cannot take:
  it only hears its prompt), every tick's text token and codes are
  transformers' greedy choice given the streams so far: the whole
  sequence's forward for the text, ``depth_decoder.generate`` for the codes;
- the waveform, decoded frame by frame, is Mimi's decode of those codes
  (``MimiModel.decode`` over all of them; generate's ``audio_sequences``)
  up to float rounding: within 1e-5 of the peak;
- sessions batched in one step (joining and leaving at other ticks, with
  other user audio) get each their own output, and replaying a session's
  user frames (sampled, seeded) gives its frames again.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from omnix.engines.duplex_batch import DuplexBatch
from omnix.engines.duplex_model import DuplexModel, Frame, Prompt, Sampling, Session
from omnix.models.moshi import TEXT_PAD, write_folder

pytestmark = pytest.mark.engines

K = 8
#: The waveform's tolerance against the whole sequence's decode, relative to
#: its peak (measured: ~5e-7).
PCM_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> DuplexModel:
    out = tmp_path_factory.mktemp("moshi") / "moshi"
    write_folder(out, seed=0)
    return DuplexModel.load(Path(out))


def _audio(kind: str, seconds: float):
    """A few seconds of 24 kHz user audio: a rising chirp, or a voice-like
    tone (harmonics, vibrato, syllable-like bursts)."""
    import torch

    t = torch.arange(int(24000 * seconds)) / 24000
    if kind == "chirp":
        return 0.3 * torch.sin(2 * math.pi * (180 + 250 * t) * t)
    f0 = 140 + 20 * torch.sin(2 * math.pi * 5 * t)
    phase = 2 * math.pi * torch.cumsum(f0, 0) / 24000
    voice = sum(torch.sin(h * phase) / h for h in range(1, 6))
    return 0.2 * voice * (0.5 + 0.5 * torch.sin(2 * math.pi * 3 * t).clamp(min=0))


def _codes(model: DuplexModel, audio):
    """Mimi's first K codes of ``audio``, the whole clip at once: [K, T]."""
    import torch

    with torch.inference_mode():
        return model.mimi.encode(audio[None, None], num_quantizers=K)[0][0]


def _run(model: DuplexModel, user, prompt: Prompt | None = None, sampling=None):
    """One session alone: its frames and waveform over the user frames [K, N]."""
    import torch

    batch = DuplexBatch(model)
    batch.join("s", prompt, sampling)
    ticks = [batch.tick({"s": user[:, i]})["s"] for i in range(user.shape[1])]
    return [t.frame for t in ticks], torch.cat([t.pcm for t in ticks]), batch.session("s")


def _silent(model: DuplexModel, n: int):
    return DuplexBatch(model).silence()[:, None].expand(K, n)


def _greedy_generate(model: DuplexModel, max_new_tokens: int, **inputs):
    return model.model.generate(
        **inputs,
        do_sample=False,
        depth_decoder_do_sample=False,
        return_audio_codes=True,
        max_new_tokens=max_new_tokens,
    )


def _codes_of(frames: list[Frame]):
    import torch

    return torch.tensor([f.codes for f in frames]).T


def test_free_ticks_with_the_user_silent_are_generates_frames(model: DuplexModel) -> None:
    import torch

    n = 40
    ref = _greedy_generate(model, n)
    frames, pcm, session = _run(model, _silent(model, n - 1))
    # generate: the initial token, then a text token a frame; the frames'
    # codes but the last (whose acoustic codes it never drew).
    texts = [model.layout.text_vocab] + [f.text for f in frames] + [session.text]
    assert ref.sequences[0].tolist() == texts
    assert torch.equal(_codes_of(frames), ref.audio_codes[0])
    audio = ref.audio_sequences[0, 0]
    assert pcm.shape == audio.shape
    assert float((pcm - audio).abs().max()) <= PCM_TOLERANCE * float(audio.abs().max())


@pytest.mark.parametrize("how", ["prompt", "forced ticks"])
def test_user_audio_as_generates_prompt_continues_as_generate(model: DuplexModel, how: str) -> None:
    import torch

    user = _codes(model, _audio("voice", 2.0))
    t = user.shape[1]
    moshi = _codes(model, torch.zeros(2 * 24000))  # Moshi silent while the user speaks
    text = torch.full((t,), TEXT_PAD)
    n = 20
    ref = _greedy_generate(
        model, n, input_ids=text[None], user_audio_codes=user[None], moshi_audio_codes=moshi[None]
    )
    silent = _silent(model, n - 1)
    if how == "prompt":
        frames, _, session = _run(model, silent, Prompt(text, moshi, user))
    else:
        batch = DuplexBatch(model, decode=False)
        batch.join("s")
        forced = [Frame(TEXT_PAD, tuple(moshi[:, i].tolist())) for i in range(t)]
        for i in range(t):
            assert batch.tick({"s": user[:, i]}, {"s": forced[i]})["s"].frame == forced[i]
        frames = [batch.tick({"s": silent[:, i]})["s"].frame for i in range(n - 1)]
        session = batch.session("s")
    texts = [model.layout.text_vocab, *text.tolist()] + [f.text for f in frames] + [session.text]
    assert ref.sequences[0].tolist() == texts
    assert torch.equal(torch.cat([moshi, _codes_of(frames)], dim=1), ref.audio_codes[0])


def _transformers_choices(model: DuplexModel, frames: list[Frame], user, next_text: int):
    """What transformers chooses at each position of this stream, greedy:
    the text token after it (the whole sequence's forward, its streams
    delayed by the model's own ``build_delay_pattern_mask``) and the depth
    decoder's codes there (``depth_decoder.generate``): [(text, codes)]."""
    import torch

    m, lay = model.model, model.layout
    n = len(frames)
    initial = torch.full((K, 1), lay.audio_vocab)
    text = torch.tensor([lay.text_vocab] + [f.text for f in frames])[None]

    def delayed(codes):
        return m.build_delay_pattern_mask(
            codes[None],
            bos_token_id=lay.audio_vocab,
            pad_token_id=lay.audio_vocab,
            max_length=n + 2,
        )[0]

    moshi = delayed(torch.cat([initial, _codes_of(frames)], dim=1))
    users = delayed(torch.cat([initial, user], dim=1))
    with torch.inference_mode():
        out = m(input_ids=text, user_audio_codes=users, moshi_audio_codes=moshi)
    texts = [*text[0, 1:].tolist(), next_text]
    depth = {**m.generation_config.depth_decoder_config, "do_sample": False}
    choices = []
    for p in range(n + 1):
        chosen = int(out.logits[0, p].argmax())
        codes = m.depth_decoder.generate(
            last_hidden_state=out.last_hidden_state[:, p : p + 1],
            input_ids=torch.tensor([[texts[p]]]),
            **depth,
        )[0, 1:]
        choices.append((chosen, codes.tolist()))
    return choices


def _assert_transformers_greedy(
    model: DuplexModel, frames: list[Frame], user, session: Session
) -> None:
    """Every choice of a session's ticks (``frames`` for ``user`` [K, n],
    then its state ``session``) is transformers' greedy choice there."""
    choices = _transformers_choices(model, frames, user, session.text)
    # Position p gives the text token and semantic code of frame p + 1 and
    # the acoustic codes of frame p (frame 0, the initial one, keeps its own).
    for p, (text, codes) in enumerate(choices):
        nxt = frames[p] if p < len(frames) else None
        assert text == (nxt.text if nxt else session.text), f"text after position {p}"
        assert codes[0] == (nxt.codes[0] if nxt else session.semantic), f"semantic {p + 1}"
        if p > 0:
            assert codes[1:] == list(frames[p - 1].codes[1:]), f"acoustic codes of frame {p}"


def test_every_tick_with_the_user_speaking_is_transformers_greedy_choice(
    model: DuplexModel,
) -> None:
    import torch

    user = _codes(model, _audio("chirp", 3.0))
    frames, pcm, session = _run(model, user)
    _assert_transformers_greedy(model, frames, user, session)
    # The waveform is Mimi's decode of those codes, frame for frame.
    with torch.inference_mode():
        whole = model.mimi.decode(_codes_of(frames)[None]).audio_values[0, 0]
    assert pcm.shape == whole.shape == (len(frames) * model.layout.frame_samples,)
    assert float((pcm - whole).abs().max()) <= PCM_TOLERANCE * float(whole.abs().max())
    assert float(whole.abs().max()) > 0.05  # audible
    # Moshi heard the user: the same ticks with the user silent differ.
    silent_frames, _, _ = _run(model, _silent(model, user.shape[1]))
    assert silent_frames != frames


def test_sessions_batched_in_one_step_each_get_their_own_output(model: DuplexModel) -> None:
    import torch

    users = {
        "a": _codes(model, _audio("chirp", 2.4)),
        "b": _codes(model, _audio("voice", 2.4)),
        "c": _codes(model, _audio("voice", 1.2).flip(0)),
    }
    joins = {"a": 0, "b": 5, "c": 12}  # the tick each joins at
    leaves = {"a": 20, "b": 30, "c": 27}  # and leaves before
    batch = DuplexBatch(model)
    got: dict[str, list] = {sid: [] for sid in users}
    states = {}
    for tick in range(30):
        for sid in users:
            if joins[sid] == tick:
                batch.join(sid)
                states[sid] = batch.session(sid)
            if leaves[sid] == tick:
                batch.leave(sid)
        frames = {sid: users[sid][:, tick - joins[sid]] for sid in batch.sessions}
        for sid, out in batch.tick(frames).items():
            got[sid].append(out)
    for sid, user in users.items():
        ticks = leaves[sid] - joins[sid]
        alone, pcm, _ = _run(model, user[:, :ticks])
        assert [t.frame for t in got[sid]] == alone, sid
        assert torch.equal(torch.cat([t.pcm for t in got[sid]]), pcm), sid
    # And the one that joined late and left last, held to transformers itself.
    ticks = leaves["b"] - joins["b"]
    _assert_transformers_greedy(
        model, [t.frame for t in got["b"]], users["b"][:, :ticks], states["b"]
    )


def test_a_session_set_aside_for_some_ticks_continues_as_if_it_had_not_been(
    model: DuplexModel,
) -> None:
    import torch

    users = {"a": _codes(model, _audio("chirp", 1.6)), "b": _codes(model, _audio("voice", 1.6))}
    aside = {"a": {3, 4, 9}, "b": {0, 5, 6, 7, 12}}  # the ticks each has no frame at
    batch = DuplexBatch(model)
    for sid in users:
        batch.join(sid)
    got: dict[str, list] = {sid: [] for sid in users}
    at = dict.fromkeys(users, 0)
    for tick in range(25):
        frames = {}
        for sid, user in users.items():
            if tick in aside[sid] or at[sid] >= user.shape[1]:
                batch.set_aside(sid)
            else:
                frames[sid] = user[:, at[sid]]
                at[sid] += 1
        for sid, out in batch.tick(frames).items():
            got[sid].append(out)
    for sid, user in users.items():
        alone, pcm, _ = _run(model, user[:, : at[sid]])
        assert [t.frame for t in got[sid]] == alone, sid
        assert torch.equal(torch.cat([t.pcm for t in got[sid]]), pcm), sid


def test_replaying_a_sessions_user_frames_gives_its_frames_again(model: DuplexModel) -> None:
    user = _codes(model, _audio("voice", 2.0))
    sampled = Sampling(text_temperature=0.7, audio_temperature=0.8, seed=7)
    first, _, _ = _run(model, user, sampling=sampled)
    again, _, _ = _run(model, user, sampling=sampled)
    other, _, _ = _run(model, user, sampling=Sampling(0.7, 25, 0.8, 250, seed=8))
    greedy, _, _ = _run(model, user)
    assert first == again
    assert first != other and first != greedy


def test_bad_frames_are_refused_naming_what_was_wrong(model: DuplexModel) -> None:
    import torch

    batch = DuplexBatch(model, decode=False)
    batch.join("s")
    with pytest.raises(ValueError, match="missing \\['s'\\]"):
        batch.tick({})
    with pytest.raises(ValueError, match="not in the batch \\['t'\\]"):
        batch.tick({"s": batch.silence(), "t": batch.silence()})
    with pytest.raises(ValueError, match="must be \\[1, 8\\] codes"):
        batch.tick({"s": torch.zeros(4, dtype=torch.long)})
    with pytest.raises(ValueError, match="user codes must be in \\[0, 2048\\)"):
        batch.tick({"s": torch.full((K,), 2048)})
    with pytest.raises(ValueError, match="a forced frame has 8 codes, got 2"):
        batch.tick({"s": batch.silence()}, {"s": Frame(TEXT_PAD, (1, 2))})
    with pytest.raises(ValueError, match="already in the batch"):
        batch.join("s")
    with pytest.raises(ValueError, match="must be as many"):
        Prompt(torch.zeros(3), torch.zeros(K, 3), torch.zeros(K, 2))
