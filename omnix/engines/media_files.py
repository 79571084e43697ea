"""Encoded media files an engine writes or the HTTP layer derives.

Owns: encoding an RGB image (``encode_image``: PNG, JPEG or WebP with
PIL's deterministic encoders), encoding RGB frames as an H.264 MP4
(``encode_mp4``, PyAV's libx264: no imageio, no ffmpeg binary), reading an
MP4's first frame back as a PNG (``mp4_thumbnail``: ``GET
/v1/videos/{id}/content?variant=thumbnail``) and its frames
(``mp4_frames``, for tests and tools).  Does not own which format a
request asked for (``StageParams``) nor where files are kept (the blob
store).
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np


def encode_image(rgb: np.ndarray, pil_format: str) -> bytes:
    """``rgb``: uint8 (height, width, 3)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb), "RGB").save(buf, format=pil_format)
    return buf.getvalue()


def encode_mp4(frames: np.ndarray, fps: int) -> bytes:
    """``frames``: uint8 (count, height, width, 3) -> an H.264 MP4 (yuv420p,
    CRF 18, one frame per 1/fps s; one encoder thread, no lookahead:
    deterministic).  Odd sides are padded by one edge pixel: 4:2:0 chroma
    needs even ones."""
    import av

    count, height, width, _ = frames.shape
    if height % 2 or width % 2:
        frames = np.pad(frames, ((0, 0), (0, height % 2), (0, width % 2), (0, 0)), mode="edge")
        count, height, width, _ = frames.shape
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps, 1))
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        # A seed must give the same file.  One encoder thread: with x264's
        # own threads the same frames gave other bytes.  No lookahead and no
        # macroblock tree: with them, identical frames in one encoder thread
        # still came out in up to 4 ways over 12 encodes in a process that
        # had run a diffusion pipeline; without, in one.
        stream.options = {
            "crf": "18",
            "preset": "veryfast",
            "x264-params": "rc-lookahead=0:mbtree=0",
        }
        stream.codec_context.thread_count = 1
        for i in range(count):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frames[i]), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


#: A decoded frame's RGB conversion runs in the calling thread alone.  A frame keeps
#: its scaler until it is freed, and swscale's own slice threads with it;
#: freed inside a child forked from this process (one that runs Python
#: before exec, as Ray's node starts do), the scaler waits forever for
#: threads the child does not have.
_SCALER_THREADS = 1


def mp4_frames(data: bytes) -> np.ndarray:
    """An MP4's frames as uint8 (count, height, width, 3)."""
    import av

    with av.open(io.BytesIO(data), "r") as container:
        frames = [
            f.to_ndarray(format="rgb24", threads=_SCALER_THREADS) for f in container.decode(video=0)
        ]
    return np.stack(frames) if frames else np.zeros((0, 0, 0, 3), np.uint8)


def mp4_thumbnail(data: bytes) -> bytes:
    """An MP4's first frame as a PNG."""
    import av

    with av.open(io.BytesIO(data), "r") as container:
        for frame in container.decode(video=0):
            return encode_image(frame.to_ndarray(format="rgb24", threads=_SCALER_THREADS), "PNG")
    raise ValueError("the video has no frames")
