"""Amounts as an operator writes them on a command line: durations, sizes, counts.

Owns: ``parse_duration`` (``90``, ``90s``, ``10m``, ``2h``), ``parse_size``
(``512MB``, ``2GB``, bytes; binary units) and ``parse_count``, each with
``off`` (also ``none``, ``inf``, ``unlimited``) for no bound, and a
``ValueError`` naming the flag for a value that is not one.  Pure
functions, no imports of omnix: any verb's flags may use them.

Does not own which flags take them (``serve_flags.py``) nor what the
values bound (``serve_options.py``: the retention policy).
"""

from __future__ import annotations

import re

_DURATION = re.compile(r"^([0-9]+(?:[.][0-9]*)?|[.][0-9]+)\s*(s|m|h|)$")
_SIZE = re.compile(r"^([0-9]+(?:[.][0-9]*)?|[.][0-9]+)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib|)$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_UNIT_B = {
    "": 1, "b": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip
_OFF = ("off", "none", "inf", "unlimited")


def parse_duration(text: str, flag: str = "--retain") -> float | None:
    """``90``, ``90s``, ``10m``, ``2h`` -> seconds; ``off`` -> None."""
    word = text.strip().lower()
    if word in _OFF:
        return None
    m = _DURATION.match(word)
    if m is None:
        raise ValueError(
            f"{flag} {text!r} is not a duration: give seconds with an optional unit s, m or h "
            "(90s, 10m, 2h), 0 to release at once, or off for no time bound"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def parse_size(text: str, flag: str = "--retain-bytes") -> int | None:
    """``512MB``, ``2GB``, ``100KB``, ``4096`` -> bytes (binary units:
    1 KB = 1024 bytes); ``off`` -> None."""
    word = text.strip().lower()
    if word in _OFF:
        return None
    m = _SIZE.match(word)
    if m is None:
        raise ValueError(
            f"{flag} {text!r} is not a size: give bytes with an optional unit KB, MB or GB "
            "(512MB, 2GB), or off for no byte bound"
        )
    return int(float(m.group(1)) * _UNIT_B[m.group(2)])


def parse_count(text: str, flag: str = "--retain-requests") -> int | None:
    """``2000`` -> 2000; ``off`` -> None."""
    word = text.strip().lower()
    if word in _OFF:
        return None
    if not word.isdigit():
        raise ValueError(
            f"{flag} {text!r} is not a count: give a whole number of requests (0 or more), "
            "or off for no count bound"
        )
    return int(word)
