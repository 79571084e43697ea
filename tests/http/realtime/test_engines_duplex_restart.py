"""A full-duplex session through a server's SIGKILL: ``omnix serve`` of the
tiny Moshi with ``--log-dir`` killed mid-session and started again on the
same directory takes the session up from its log (the ``moshi_duplex``
stage continues on the new worker by stepping every recorded user frame
again), and the client, back with ``session.resume`` and the last
``server_event_seq`` it had, gets every frame it had not, then goes on:
the frames it heard over both servers are, one for one, what the engine
gives the whole audio undisturbed (greedy), with a persona or without."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from omnix.events.types import Chunk, InputAppended, Routed, StageParams
from omnix.pipelines.persona_card import voice_stem
from omnix.testing.served import ServeProcess

from .duplex_wire import FRAME, Probe, log_events, pcm16, speech, undisturbed

pytestmark = [
    pytest.mark.engines,
    pytest.mark.timeout(600),
    pytest.mark.asyncio(loop_scope="module"),
]

MODEL = "moshi"


async def _serve(folder: Path, log_dir: Path) -> ServeProcess:
    s = await ServeProcess.start(str(folder), "--log-dir", str(log_dir))
    await s.ready(timeout=240)
    return s


ROLE = "You are a wise and friendly teacher."


@pytest.mark.parametrize(
    "persona",
    [{}, {"voice": "NATF2.pt", "instructions": ROLE}],
    ids=["moshi", "personaplex-persona"],
)
async def test_a_session_goes_on_after_the_servers_sigkill_as_if_undisturbed(
    tmp_path: Path, persona: dict[str, str]
) -> None:
    """With a persona (a PersonaPlex folder's voice and a role text) too:
    the continuation opens with the same persona frames, from the log."""
    from omnix.models.moshi import PERSONAPLEX_VOICES, write_folder

    folder = tmp_path / "moshi"
    write_folder(folder, seed=0, voices=PERSONAPLEX_VOICES if persona else None)
    log_dir = tmp_path / "log"
    before, after = 20, 12
    pcm = speech(before + after)

    first = await _serve(folder, log_dir)
    try:
        async with Probe(first.url, MODEL) as c:
            created = await c.open(**persona)
            await c.stream(pcm[: before * FRAME])
            # The frames answered (and so in the log), perhaps not all read
            # when the server dies.
            await c.wait("response.output_audio.delta", before - 2)
            await first.kill9()
            await c.finish()
    finally:
        await first.close()
    sid = created["session"]["id"]

    second = await _serve(folder, log_dir)
    try:
        async with Probe(second.url, MODEL) as back:
            back.last_seq = c.last_seq
            await back.send(
                {
                    "type": "session.resume",
                    "session_id": sid,
                    "resume_token": created["resume_token"],
                    "last_received_server_event_seq": c.last_seq,
                }
            )
            assert (await back.wait("session.resumed"))["session_id"] == sid
            await back.stream(pcm[before * FRAME :], start=before)
            await back.send({"type": "session.close"})
            closed = await back.wait("session.closed", timeout=120)
        events = await log_events(second.url, sid)
    finally:
        await second.stop()
    assert closed["reason"] == "client_close"
    assert not back.of("error")

    # The client heard each frame once, in order, over both servers.
    deltas = c.of("response.output_audio.delta") + back.of("response.output_audio.delta")
    assert [d["metadata"]["frame"] for d in deltas] == list(range(before + after))

    # ... and they are the undisturbed session's.
    params = StageParams(
        voice=voice_stem(persona["voice"]) if persona else None,
        instructions=persona.get("instructions"),
    )
    want = await undisturbed(str(folder), pcm, params)
    got = np.stack([np.frombuffer(d, dtype="<i2") for d in c.audio() + back.audio()])
    expect = np.stack([pcm16(o.array) for o in want])
    assert np.abs(got.astype(int) - expect).max() <= 1
    chunks = [e for e in events if type(e) is Chunk]
    assert [e.token_ids for e in chunks] == [o.token_ids for o in want]
    texts = c.of("response.output_audio_transcript.delta") + back.of(
        "response.output_audio_transcript.delta"
    )
    assert "".join(t["delta"] for t in texts) == "".join(o.text for o in want)

    # The log: the stage continued after the frames it had delivered.
    frames_in = [e for e in events if type(e) is InputAppended and e.blob is not None]
    assert len(frames_in) == before + after
    (moved,) = [e for e in events if type(e) is Routed and e.resume]
    assert moved.resume == before and moved.seq == 0
