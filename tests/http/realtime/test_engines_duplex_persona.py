"""A PersonaPlex persona over ``/v1/realtime?duplex=1``: ``omnix serve`` of
a PersonaPlex-style folder (the tiny Moshi with voice prompts in
``voices/``) takes a session's ``voice`` (as PersonaPlex's clients name it,
``NATF2.pt``, or ``NATF2``) and ``instructions`` (the role text), records
them in the log (the session's options and its stage's parameters, what a
continuation opens with again), and the client hears what the engine gives
that audio after that persona's opening frames; a voice the folder lacks,
or a role text too long, is one ``error`` naming it and opens nothing.  (A
persona through the server's SIGKILL: test_engines_duplex_restart.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from omnix.events.options import DuplexOptions
from omnix.events.types import Admitted, StageParams
from omnix.testing.served import ServeProcess

from .duplex_wire import FRAME, Probe, log_events, pcm16, session_payload, speech, undisturbed

pytestmark = [
    pytest.mark.engines,
    pytest.mark.timeout(600),
    pytest.mark.asyncio(loop_scope="module"),
]

MODEL = "personaplex"
ROLE = "You are a wise and friendly teacher. Answer questions in a clear and engaging way."


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from omnix.models.moshi import PERSONAPLEX_VOICES, write_folder

    out = tmp_path_factory.mktemp("personaplex") / MODEL
    write_folder(out, seed=0, voices=PERSONAPLEX_VOICES)
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(folder):
    s = await ServeProcess.start(str(folder))
    try:
        await s.ready(timeout=240)
        yield s
    finally:
        await s.stop()


async def test_a_session_speaks_with_the_voice_and_role_it_asked_for(served, folder) -> None:
    n = 12
    pcm = speech(n)
    async with Probe(served.url, MODEL) as c:
        created = await c.open(voice="NATF2.pt", instructions=ROLE)
        sid = created["session"]["id"]
        assert created["session"]["voice"] == "NATF2"
        assert created["session"]["instructions"] == ROLE
        await c.stream(pcm)
        await c.send({"type": "session.close"})
        await c.wait("session.closed")
    assert not c.of("error")

    want = await undisturbed(str(folder), pcm, StageParams(voice="NATF2", instructions=ROLE))
    got = np.frombuffer(b"".join(c.audio()), dtype="<i2").reshape(n, FRAME)
    assert np.abs(got.astype(int) - np.stack([pcm16(o.array) for o in want])).max() <= 1
    # ... which is not what the model says with no persona.
    assert [o.token_ids for o in await undisturbed(str(folder), pcm)] != [o.token_ids for o in want]

    (adm,) = [e for e in await log_events(served.url, sid) if type(e) is Admitted]
    opts = adm.spec.response
    assert isinstance(opts, DuplexOptions)
    assert (opts.voice, opts.instructions) == ("NATF2", ROLE)
    params = adm.spec.stage_params[opts.audio_stage]
    assert (params.voice, params.instructions) == ("NATF2", ROLE)


async def test_a_persona_the_checkpoint_lacks_is_one_error_naming_it(served) -> None:
    async with Probe(served.url, MODEL) as c:
        for session in ({"voice": "NATF9.pt"}, {"instructions": "x" * 1001}):
            await c.send({"type": "session.update", "session": session_payload(MODEL, **session)})
        await c.wait("error", 2)
        voice, role = (e["error"] for e in c.of("error"))
        assert voice["code"] == "unknown_voice" and voice["param"] == "session.voice"
        assert "NATF9.pt" in voice["message"] and "NATF2, NATM1" in voice["message"]
        assert role["code"] == "invalid_value" and role["param"] == "session.instructions"
        assert not c.of("session.created")
        # The socket goes on: a session with a voice the folder has opens.
        created = await c.open(voice="NATM1")
        assert created["session"]["voice"] == "NATM1"
