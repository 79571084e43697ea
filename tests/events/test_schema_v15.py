"""Schema v15: a Qwen3-TTS Base request's message carries the speaker
vector it clones with (media kind ``speaker``) beside its reference audio,
so the log holds what the talker used; records of v14 (a clip alone) read
as before (v15 appended a value to a literal, so their bytes are the same)."""

from __future__ import annotations

from omnix.events.codec import decode_event, encode_event
from omnix.events.types import (
    SCHEMA_VERSION,
    Admitted,
    BlobRef,
    ChatMessage,
    MediaPart,
    RequestSpec,
)

CLIP = BlobRef(digest="a" * 32, nbytes=4 * 24000, dtype="float32", shape=(24000,))
VECTOR = BlobRef(digest="b" * 32, nbytes=4 * 64, dtype="float32", shape=(64,))


def _admitted(*parts: MediaPart) -> Admitted:
    message = ChatMessage(role="user", content="What the clip says.", media=parts)
    spec = RequestSpec(prompt="Say it in my voice.", messages=(message,), outputs=("audio",))
    return Admitted(pos=0, ts_ns=10, request_id="speech-1", pipeline="tts", spec=spec)


def test_a_cloned_requests_speaker_vector_round_trips() -> None:
    adm = _admitted(
        MediaPart(kind="audio", blob=CLIP, rate=24000), MediaPart(kind="speaker", blob=VECTOR)
    )
    data = encode_event(adm)
    assert data[0] == SCHEMA_VERSION == 15
    back = decode_event(data)
    assert back == adm
    assert isinstance(back, Admitted)
    assert [p.kind for p in back.spec.messages[0].media] == ["audio", "speaker"]


def test_a_v14_record_of_a_clip_alone_reads_as_before() -> None:
    adm = _admitted(MediaPart(kind="audio", blob=CLIP, rate=24000))
    data = bytearray(encode_event(adm))
    data[0] = 14
    assert decode_event(bytes(data)) == adm
