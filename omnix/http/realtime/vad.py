"""Server VAD: where speech starts and stops in a session's input audio.

Owns ``SpeechDetector``: a session's appended audio (pcm16, 24 kHz)
resampled to 16 kHz (libswresample, streaming) and read 32 ms at a time
by Silero VAD (the ``silero-vad`` package's model, which ships in its
wheel: nothing is downloaded; run with torch on the CPU, one model per
session since it carries state from one window to the next), turned into
``Turn`` events on the session's audio clock with OpenAI's ``server_vad``
rules: speech starts at the first window whose probability reaches
``threshold``, reported ``prefix_padding_ms`` earlier; it stops once
``silence_duration_ms`` of windows fall below ``threshold - 0.15``
(hysteresis, as Silero's own iterator does), reported where the last
speech window ended.

``feed`` does the CPU work and holds no lock of the event loop's: the
session calls it in a thread.  Does not own what a turn does (commit,
respond, interrupt: ``session.py``).
"""

from __future__ import annotations

import importlib.resources
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Final, Literal

import av
import numpy as np

#: Silero's window at 16 kHz: 512 samples, 32 ms.
WINDOW: Final = 512
WINDOW_MS: Final = 32
RATE: Final = 16_000

_model_bytes: bytes | None = None
_lock = threading.Lock()


def _load_model() -> Any:
    """A fresh Silero VAD model (TorchScript), from the bytes of the one
    in the ``silero-vad`` wheel, read once per process."""
    global _model_bytes
    import io

    import torch

    with _lock:
        if _model_bytes is None:
            ref = importlib.resources.files("silero_vad.data").joinpath("silero_vad.jit")
            _model_bytes = ref.read_bytes()
        data = _model_bytes
    with warnings.catch_warnings():
        # torch 2.13 deprecates TorchScript loading; Silero ships its model so.
        warnings.simplefilter("ignore", DeprecationWarning)
        model = torch.jit.load(io.BytesIO(data), map_location="cpu")
    model.eval()
    return model


def available() -> str | None:
    """Why server VAD cannot run here (None when it can)."""
    import importlib.util

    for name in ("silero_vad", "torch"):
        if importlib.util.find_spec(name) is None:
            return f"server VAD needs the silero-vad package and torch ({name} is not installed)"
    return None


@dataclass(frozen=True, slots=True)
class Turn:
    """Speech started or stopped, at ``ms`` on the session's audio clock."""

    kind: Literal["started", "stopped"]
    ms: int


class SpeechDetector:
    """One session's server VAD (see the module's docstring)."""

    def __init__(
        self,
        threshold: float = 0.5,
        prefix_padding_ms: int = 300,
        silence_duration_ms: int = 500,
        start_ms: int = 0,
    ) -> None:
        self.threshold = threshold
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_duration_ms = silence_duration_ms
        self._model = _load_model()
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE)
        self._pending = np.zeros(0, np.float32)
        self._in = 0  # 24 kHz samples fed
        #: where the next window starts, in ms on the session's audio clock
        self._at = float(start_ms)
        self._start_ms = start_ms
        self.speaking = False
        self._speech_end = 0.0
        self._silence = 0.0

    def configure(self, threshold: float, prefix_padding_ms: int, silence_duration_ms: int) -> None:
        self.threshold = threshold
        self.prefix_padding_ms = prefix_padding_ms
        self.silence_duration_ms = silence_duration_ms

    def feed(self, pcm: bytes) -> list[Turn]:
        """The turns ``pcm`` (pcm16, 24 kHz, following what was fed) completes."""
        import torch

        x = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        if x.size == 0:
            return []
        frame = av.AudioFrame.from_ndarray(x[None, :], format="flt", layout="mono")
        frame.sample_rate = 24000
        frame.pts = self._in
        self._in += x.size
        pieces: list[np.ndarray] = [self._pending]
        pieces += [out.to_ndarray().reshape(-1) for out in self._resampler.resample(frame)]
        samples = np.concatenate(pieces)
        turns: list[Turn] = []
        n = samples.size // WINDOW * WINDOW
        with torch.inference_mode():
            for i in range(0, n, WINDOW):
                window = torch.from_numpy(samples[i : i + WINDOW].copy())
                prob = float(self._model(window, RATE))
                turn = self._step(prob)
                if turn is not None:
                    turns.append(turn)
        self._pending = samples[n:].copy()
        return turns

    def _step(self, prob: float) -> Turn | None:
        start = self._at
        self._at += WINDOW_MS
        if not self.speaking:
            if prob >= self.threshold:
                self.speaking = True
                self._silence = 0.0
                self._speech_end = self._at
                at = max(self._start_ms, int(start) - self.prefix_padding_ms)
                return Turn("started", at)
            return None
        if prob >= self.threshold - 0.15:
            self._silence = 0.0
            self._speech_end = self._at
            return None
        self._silence += WINDOW_MS
        if self._silence >= self.silence_duration_ms:
            self.speaking = False
            return Turn("stopped", int(self._speech_end))
        return None
