"""A PersonaPlex persona (a voice prompt from the folder's ``voices/`` and a
role text) as a duplex session's opening frames: PersonaPlex's system
prompt (the voice as Moshi's audio over padding text, half a second of
silence, the role text in system tags one token a frame, half a second of
silence; a 440 Hz tone as the user's throughout), stepped before the
session's first user frame, so the session gives what the model gives a
session started with those frames; the same after a continuation; a
persona the folder lacks fails that session alone, naming it."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from omnix.events.types import StageParams
from omnix.transport.work import GenerateRequest, InputPiece, Resume

pytestmark = pytest.mark.engines
module_loop = pytest.mark.asyncio(loop_scope="module")

K = 8
FRAME = 1920
ROLE = "You are a wise and friendly teacher."


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from omnix.models.moshi import PERSONAPLEX_VOICES, write_folder

    out = tmp_path_factory.mktemp("personaplex") / "personaplex"
    write_folder(out, seed=0, voices=PERSONAPLEX_VOICES)
    return out


@pytest.fixture(scope="module")
def model(folder: Path):
    import torch

    from omnix.engines.duplex_model import DuplexModel

    torch.set_num_threads(1)
    return DuplexModel.load(folder)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(folder: Path, model) -> AsyncIterator:
    from omnix.engines.duplex_engine import DuplexEngine
    from omnix.pipelines.config import DuplexArgs

    eng = DuplexEngine(
        DuplexArgs(model=str(folder), device="cpu", max_sessions=2, tick_ms=0), model=model
    )
    await eng.start()
    yield eng
    await eng.close()


def _voice(frames: int) -> np.ndarray:
    t = np.arange(frames * FRAME) / 24000
    f0 = 140 + 20 * np.sin(2 * math.pi * 5 * t)
    phase = 2 * math.pi * np.cumsum(f0) / 24000
    return (0.2 * sum(np.sin(h * phase) / h for h in range(1, 6))).astype(np.float32)


def _request(rid: str, **params) -> GenerateRequest:
    return GenerateRequest(request_id=rid, stage="duplex", params=StageParams(**params), seed=0)


async def _pieces(audio: np.ndarray):
    yield InputPiece()  # the admission of a session whose input streams
    for k in range(0, audio.size, FRAME):
        yield InputPiece(modality="audio", array=audio[k : k + FRAME])


def _alone(model, prompt, audio: np.ndarray) -> list[tuple[int, ...]]:
    """What ``DuplexBatch`` gives one session started with ``prompt``."""
    import torch

    from omnix.engines.duplex_batch import DuplexBatch

    with torch.inference_mode():
        user = model.mimi.encode(torch.from_numpy(audio)[None, None], num_quantizers=K)[0][0]
    batch = DuplexBatch(model, decode=False)
    batch.join("s", prompt=prompt)
    ticks = [batch.tick({"s": user[:, i]})["s"] for i in range(user.shape[1])]
    return [(t.frame.text, *t.frame.codes) for t in ticks]


def test_the_opening_frames_are_personaplexs_system_prompt(folder: Path, model) -> None:
    import soundfile as sf
    import torch
    from tokenizers import Tokenizer

    from omnix.engines.duplex_persona import SILENCE_FRAMES, TEXT_PAD, PersonaPrompts

    prompts = PersonaPrompts(folder, model)
    p = prompts.prompt("NATF2.pt", ROLE)
    assert p is not None
    pcm, rate = sf.read(str(folder / "voices" / "NATF2.wav"), dtype="float32")
    voice = math.ceil(pcm.size / FRAME)  # the last frame padded with zeros
    role = (
        Tokenizer.from_file(str(folder / "tokenizer.json"))
        .encode(f"<system> {ROLE} <system>", add_special_tokens=False)
        .ids
    )
    n = voice + SILENCE_FRAMES + len(role) + SILENCE_FRAMES
    assert rate == 24000 and p.text.shape == (n,) and p.moshi.shape == p.user.shape == (K, n)

    padded = np.pad(pcm, (0, voice * FRAME - pcm.size))
    with torch.inference_mode():
        codes = model.mimi.encode(torch.from_numpy(padded)[None, None], num_quantizers=K)[0][0]
        silence = model.mimi.encode(torch.zeros(1, 1, FRAME), num_quantizers=K)[0][0, :, 0]
    t = np.arange(FRAME) / 24000
    tone = torch.from_numpy((0.5 * np.sin(2 * math.pi * 440 * t)).astype(np.float32))
    with torch.inference_mode():
        sine = model.mimi.encode(tone[None, None], num_quantizers=K)[0][0, :, 0]
    assert torch.equal(p.moshi[:, :voice], codes)
    assert p.text[:voice].tolist() == [TEXT_PAD] * voice
    rest = slice(voice, n)
    assert torch.equal(p.moshi[:, rest], silence[:, None].expand(K, n - voice))
    role_at = voice + SILENCE_FRAMES
    assert p.text[rest].tolist() == (
        [TEXT_PAD] * SILENCE_FRAMES + role + [TEXT_PAD] * SILENCE_FRAMES
    )
    assert p.text[role_at : role_at + len(role)].tolist() == role
    assert torch.equal(p.user, sine[:, None].expand(K, n))

    # A voice alone, a role alone, neither.
    assert prompts.prompt("NATM1", "").text.shape == (voice + SILENCE_FRAMES,)  # type: ignore[union-attr]
    assert prompts.prompt("", ROLE).text.shape == (2 * SILENCE_FRAMES + len(role),)  # type: ignore[union-attr]
    assert prompts.prompt("default", "") is None


@module_loop
async def test_a_session_with_a_persona_gives_what_the_model_gives_after_those_frames(
    engine, folder: Path, model
) -> None:
    from omnix.engines.duplex_persona import PersonaPrompts

    audio = _voice(6)
    got = [
        o
        async for o in engine.generate(
            _request("p", voice="NATF2", instructions=ROLE), _pieces(audio)
        )
    ]
    prompt = PersonaPrompts(folder, model).prompt("NATF2", ROLE)
    want = _alone(model, prompt, audio)
    assert [o.token_ids for o in got[:-1]] == want
    assert got[-1].finish_reason == "stop" and got[-1].prompt_tokens == 6
    # The persona reaches the model: without it, it says otherwise.
    assert want != _alone(model, None, audio)


@module_loop
async def test_a_continuation_opens_with_the_same_persona(engine) -> None:
    audio = _voice(7)
    params = {"voice": "NATM1", "instructions": ROLE, "temperature": 0.8}
    whole = [o async for o in engine.generate(_request("u", **params), _pieces(audio))]
    moved = GenerateRequest(
        request_id="m",
        stage="duplex",
        params=StageParams(**params),
        seed=999,
        resume=Resume(chunks=3, seed=0),
    )
    rest = [o async for o in engine.generate(moved, _pieces(audio))]
    assert [o.token_ids for o in rest[:-1]] == [o.token_ids for o in whole[3:-1]]


@module_loop
async def test_a_persona_the_folder_lacks_fails_that_session_alone(engine, folder: Path) -> None:
    audio = _voice(3)

    async def fails(**params) -> str:
        with pytest.raises(ValueError) as err:
            async for _ in engine.generate(_request("bad", **params), _pieces(audio)):
                pass
        return str(err.value)

    beside = asyncio.create_task(  # a session beside the failing ones
        _collect(engine.generate(_request("ok", voice="NATF2"), _pieces(_voice(8))))
    )
    assert "'NATF9'" in await fails(voice="NATF9.pt")
    assert "NATF2, NATM1" in await fails(voice="NATF9")
    (folder / "voices" / "VARF0.pt").write_bytes(b"")
    try:
        from omnix.engines.duplex_engine import DuplexEngine
        from omnix.pipelines.config import DuplexArgs

        fresh = DuplexEngine(
            DuplexArgs(model=str(folder), device="cpu", tick_ms=0), model=engine.model
        )
        await fresh.start()
        try:
            with pytest.raises(ValueError, match=r"voices/VARF0\.wav"):
                async for _ in fresh.generate(_request("pt", voice="VARF0.pt"), _pieces(audio)):
                    pass
        finally:
            await fresh.close()
    finally:
        (folder / "voices" / "VARF0.pt").unlink()
    outs = await beside
    assert len(outs) == 9 and outs[-1].finish_reason == "stop"


@module_loop
async def test_a_moshi_folder_takes_no_role_text(tmp_path: Path, model) -> None:
    from omnix.engines.duplex_engine import DuplexEngine
    from omnix.models.moshi import write_folder
    from omnix.pipelines.config import DuplexArgs

    plain = tmp_path / "moshi"
    write_folder(plain, seed=0)
    eng = DuplexEngine(DuplexArgs(model=str(plain), device="cpu", tick_ms=0), model=model)
    await eng.start()
    try:
        with pytest.raises(ValueError, match="takes no role text"):
            async for _ in eng.generate(_request("r", instructions=ROLE), _pieces(_voice(2))):
                pass
    finally:
        await eng.close()


async def _collect(stream) -> list:
    return [o async for o in stream]
