"""What persona a Moshi folder takes, read from the folder alone: a plain
Moshi none; a PersonaPlex-style one its ``voices/`` audio as voices (by the
voice's name or its file's), PersonaPlex's precomputed ``.pt`` embeddings
listed apart (omnix does not read them), and a role text."""

from __future__ import annotations

from omnix.pipelines.persona_card import PersonaCard, read_persona_card, voice_file, voice_stem


def test_a_moshi_folder_takes_no_persona(tmp_path) -> None:
    assert read_persona_card(tmp_path) == PersonaCard()


def test_a_personaplex_folder_lists_its_voices_audio_and_the_embeddings_apart(tmp_path) -> None:
    voices = tmp_path / "voices"
    voices.mkdir()
    for name in ("NATM1.wav", "NATF2.wav", "NATF2.pt", "VARF0.pt", "notes.txt"):
        (voices / name).write_bytes(b"")
    assert read_persona_card(tmp_path) == PersonaCard(
        voices=("NATF2", "NATM1"), embeddings=("VARF0",), role_text=True
    )


def test_a_voice_is_named_by_itself_or_by_its_file() -> None:
    assert voice_stem("NATF2.pt") == voice_stem("NATF2.wav") == voice_stem("NATF2") == "NATF2"
    assert voice_file("/m", "NATF2.pt").as_posix() == "/m/voices/NATF2.wav"
