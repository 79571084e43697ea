"""What both TTS benches say, and at which concurrency levels.

Owns ``TEXTS`` (the sentences a level's requests speak, in turn),
``bench_texts`` and ``parse_levels`` (``--levels``).  Shared by the bench
against the reference (``tts.py``) and the stages alone on a GPU
(``tts_stages.py``); owns no measurement.
"""

from __future__ import annotations

from omnix.usage import UsageError, counts

TEXTS = (
    "Hello there, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "Please read the next sentence slowly and clearly.",
    "Seven bright stars shine above the quiet river.",
    "The train to the city leaves at half past nine.",
    "A small garden grows tomatoes, beans and sweet peas.",
    "Thank you for calling, how can I help you?",
    "The weather tomorrow will be cool and windy.",
)


def parse_levels(text: str) -> tuple[int, ...]:
    """``--levels``: concurrency levels from 1 to 64."""
    try:
        return counts(text, 64, "1,4,16")
    except ValueError as exc:
        raise UsageError(f"--levels {exc}") from None


def bench_texts(n: int, words: int) -> list[str]:
    out = [TEXTS[i % len(TEXTS)] for i in range(n)]
    return [" ".join(t.split()[:words]) for t in out] if words else out
