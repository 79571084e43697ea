"""Strict base64, decoded without holding the GIL for long.

Owns ``b64decode``: a part's base64 (standard alphabet, padded; line
wrapped MIME style accepted), large payloads decoded with numpy, whose
element-wise loops release the GIL (binascii holds it for a whole call:
40 ms for 13 MB of text, all of it lost to the event loop).
"""

from __future__ import annotations

import binascii
from typing import Final

import numpy as np

from omnix.http.media.common import bad

# Base64 longer than this is decoded with numpy (see _b64_strict); shorter
# takes binascii under 2 ms.
_B64_NUMPY_FROM: Final = 1 << 19


def b64decode(param: str, text: str, start: int) -> bytes:
    """``text[start:]`` as strict (padded, standard alphabet) base64."""
    try:
        return _b64_strict(text, start)
    except ValueError:
        pass
    # Line-wrapped base64 (MIME style) is still base64.
    if any(c in text for c in " \t\r\n"):
        try:
            return _b64_strict("".join(text[start:].split()), 0)
        except ValueError:
            pass
    raise bad(
        param,
        f"{param}: the data is not valid base64 (truncated, or characters outside "
        "A-Z a-z 0-9 + / =); send the file's bytes as standard padded base64.",
    )


_B64_VALUES = np.full(256, 255, np.uint8)
_B64_VALUES[
    np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)
] = np.arange(64, dtype=np.uint8)


def _b64_strict(text: str, start: int) -> bytes:
    """Raises ValueError (binascii.Error, UnicodeEncodeError) on bad input.

    binascii holds the GIL for a whole call: 40 ms for 13 MB of text, all
    of it lost to the event loop however the text is sliced (the loop then
    waits a switch interval, 5 ms, for every turn).  numpy's element-wise
    loops release the GIL, so large payloads are decoded with them.
    """
    if len(text) - start <= _B64_NUMPY_FROM:
        return binascii.a2b_base64(text[start:], strict_mode=True)
    raw = np.frombuffer(text.encode("ascii"), np.uint8)[start:]
    if raw.size % 4:
        raise ValueError("base64 length is not a multiple of 4")
    pad = 2 if text.endswith("==") else 1 if text.endswith("=") else 0
    full = raw.size // 4 - (1 if pad else 0)
    values = _B64_VALUES[raw[: full * 4]]
    if (values == 255).any():  # also "=" before the end
        raise ValueError("characters outside the base64 alphabet")
    tail = binascii.a2b_base64(text[len(text) - 4 :], strict_mode=True) if pad else b""
    out = np.empty(full * 3 + len(tail), np.uint8)
    groups = out[: full * 3].reshape(full, 3)
    a, b, c, d = (values[k::4] for k in range(4))
    np.bitwise_or(a << 2, b >> 4, out=groups[:, 0])
    np.bitwise_or(b << 4, c >> 2, out=groups[:, 1])
    np.bitwise_or(c << 6, d, out=groups[:, 2])
    out[full * 3 :] = np.frombuffer(tail, np.uint8)
    return out.tobytes()
