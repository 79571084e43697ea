"""Audio encoders for HTTP responses: whole files and streams.

Owns: turning float PCM (what audio stages emit, mono, [-1, 1]) into the
formats OpenAI's APIs speak: ``wav``, ``flac`` (libsndfile, via
soundfile), ``mp3``, ``opus`` (Ogg), ``aac`` (ADTS) (FFmpeg, via PyAV) and
``pcm`` (raw signed 16-bit little-endian, OpenAI's ``pcm``/``pcm16``).
``encode_audio`` writes a complete, seekable file; ``StreamEncoder``
produces the same format incrementally, returning the bytes each piece of
audio completes (a stream's headers cannot know its length: WAV's sizes
are 0xFFFFFFFF, which soundfile, FFmpeg and browsers accept).

Does not own which format a client asked for (recorded in the request's
options) nor sample rates (the pipeline's audio stage decides).

Determinism matters: replay regenerates a client's bytes from the log, so
every encoder here runs with FFmpeg's ``bitexact`` flags (no random Ogg
serial numbers, no version strings) and is fed identical pieces in
identical order.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

AudioFormat = Literal["wav", "mp3", "flac", "opus", "aac", "pcm"]
AUDIO_FORMATS: tuple[AudioFormat, ...] = ("wav", "mp3", "flac", "opus", "aac", "pcm")

MEDIA_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "pcm": "audio/pcm",
}

# format -> (FFmpeg muxer, encoder, muxer options)
_FFMPEG: dict[str, tuple[str, str, dict[str, str]]] = {
    "wav": ("wav", "pcm_s16le", {}),
    "flac": ("flac", "flac", {}),
    "mp3": ("mp3", "libmp3lame", {}),
    # Ogg buffers a page for up to a second by default; 20 ms pages let a
    # stream's first packet leave with the first audio.
    "opus": ("ogg", "libopus", {"page_duration": "20000"}),
    "aac": ("adts", "aac", {}),
}
_OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


def normalize_format(fmt: str) -> AudioFormat:
    """Chat's ``pcm16`` is speech's ``pcm``."""
    name = "pcm" if fmt == "pcm16" else fmt
    for known in AUDIO_FORMATS:
        if known == name:
            return known
    raise ValueError(f"unknown audio format {name!r} (known: {', '.join(AUDIO_FORMATS)})")


def as_mono_float(samples: np.ndarray) -> np.ndarray:
    """A contiguous 1-D float32 view of a stage's audio output."""
    x = np.asarray(samples)
    if x.ndim > 1:
        # (1, n) / (n, 1) are mono; anything wider is mixed down.
        x = x.reshape(-1) if 1 in x.shape else x.mean(axis=0 if x.shape[0] < x.shape[-1] else -1)
    return np.ascontiguousarray(x, dtype=np.float32)


def to_pcm16(samples: np.ndarray) -> bytes:
    """Raw signed 16-bit little-endian PCM (clipped to [-1, 1])."""
    x = as_mono_float(samples)
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: AudioFormat) -> bytes:
    """A complete audio file of ``samples`` in ``fmt``."""
    x = as_mono_float(samples)
    if fmt == "pcm":
        return to_pcm16(x)
    if fmt in ("wav", "flac"):
        import soundfile as sf

        buf = io.BytesIO()
        sf.write(buf, x, sample_rate, format=fmt.upper(), subtype="PCM_16")
        return buf.getvalue()
    buf = io.BytesIO()
    enc = _AvEncoder(fmt, sample_rate, buf)
    enc.write(x)
    enc.close()
    return buf.getvalue()


class _Sink(io.RawIOBase):
    """A non-seekable file for FFmpeg to write a stream into; ``take``
    returns what was written since the last call."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, b: ReadableBuffer) -> int:
        # PyAV writes ``bytes``; a memoryview counts any buffer in bytes.
        data = memoryview(b)
        self._buf += data
        return data.nbytes

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


class _AvEncoder:
    def __init__(self, fmt: str, sample_rate: int, out: io.IOBase) -> None:
        import av

        muxer, codec, options = _FFMPEG[fmt]
        self._av = av
        self.sample_rate = sample_rate
        self.container = av.open(out, "w", format=muxer, options=dict(options))
        flags = av.container.Flags
        # flush_packets: a stream's bytes leave with each packet, not when
        # FFmpeg's I/O buffer fills.
        self.container.flags = (
            # PyAV's stub declares each Flags member ``ClassVar[Flags]``, so
            # mypy takes ``.value`` for a Flags; at runtime it is the int.
            self.container.flags | flags.bitexact.value | flags.flush_packets.value  # type: ignore[operator]
        )
        rate = sample_rate
        if codec == "libopus" and rate not in _OPUS_RATES:
            rate = 48000  # PyAV resamples the frames
        stream = self.container.add_stream(codec, rate=rate, layout="mono")
        # add_stream is typed by codec name; these codecs are all audio.
        assert isinstance(stream, av.audio.stream.AudioStream)
        self.stream = stream
        ctx = self.stream.codec_context
        ctx.flags = ctx.flags | av.codec.context.Flags.bitexact.value
        self._pts = 0
        self._closed = False

    def write(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        frame = self._av.AudioFrame.from_ndarray(x.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        self._pts += x.size
        for packet in self.stream.encode(frame):
            self.container.mux(packet)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        self.container.close()


class StreamEncoder:
    """Encode audio as it arrives: ``write`` returns the bytes that piece
    completed (possibly none: encoders keep a frame's worth), ``finish`` the
    rest.  The concatenation of everything returned is a playable file."""

    def __init__(self, fmt: AudioFormat, sample_rate: int) -> None:
        self.fmt = fmt
        self.sample_rate = sample_rate
        self._sink: _Sink | None = None
        self._enc: _AvEncoder | None = None
        if fmt != "pcm":
            self._sink = _Sink()
            self._enc = _AvEncoder(fmt, sample_rate, self._sink)

    def write(self, samples: np.ndarray) -> bytes:
        if self._enc is None:
            return to_pcm16(samples)
        assert self._sink is not None
        self._enc.write(as_mono_float(samples))
        return self._sink.take()

    def finish(self) -> bytes:
        if self._enc is None:
            return b""
        assert self._sink is not None
        self._enc.close()
        return self._sink.take()
