"""A video job's ``Video`` object, as a pure function of its request's events.

Owns ``video``: the job as its events so far show it (``queued`` until
the video stage starts, ``in_progress`` with ``progress`` = the stage's
last ``Progress`` step over its total, ``completed`` at ``Finished``,
``failed`` with the error at ``Failed``, ``Cancelled`` or ``Rejected``),
and ``whole``: what ``POST /v1/videos`` answered, the job as admitted
(``queued``, progress 0), so a replay renders the bytes the client got.

Does not own the dispatch over APIs nor the entry points
(``omnix.http.render``), nor the MP4 (the engine encoded it; the content
route serves the chunk's blob).
"""

from __future__ import annotations

from omnix.events.options import VideoOptions
from omnix.events.types import Cancelled, Failed, Finished, Rejected
from omnix.http.common.rendering import Rendered, encode, json_head, terminal_error
from omnix.http.common.summary import Summary
from omnix.http.videos.protocol import Video, VideoError, VideoStatus


def video(s: Summary, opts: VideoOptions, *, started: bool = False) -> Video:
    """The job ``s`` folded so far; ``started``: its video stage began."""
    status: VideoStatus = "in_progress" if started else "queued"
    step, total = s.progress
    progress = min(99, step * 100 // total) if total else 0
    completed_at = None
    error = None
    term = s.terminal
    if isinstance(term, Finished):
        status, progress = "completed", 100
        completed_at = term.ts_ns // 1_000_000_000
    elif isinstance(term, (Failed, Cancelled, Rejected)):
        status = "failed"
        completed_at = term.ts_ns // 1_000_000_000
        err = terminal_error(term)
        code = term.reason if not isinstance(term, Cancelled) else "cancelled"
        message = err[1].decode() if err is not None else code
        error = VideoError(code=code, message=_message(message))
    spec = s.spec
    return Video(
        id=s.request_id,
        model=spec.model if spec is not None else "",
        status=status,
        progress=progress,
        created_at=s.created,
        completed_at=completed_at,
        error=error,
        prompt=spec.prompt if spec is not None else None,
        seconds=opts.seconds,
        size=opts.size,
        fps=opts.fps,
        num_frames=opts.num_frames,
        request_ids=[s.request_id],
    )


def _message(body: str) -> str:
    """The ``message`` of an OpenAI error body."""
    import json

    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body


def whole(s: Summary, opts: VideoOptions) -> Rendered:
    """``POST /v1/videos``' answer: the job as admitted."""
    queued = Summary(s.blobs)
    queued.request_id, queued.spec, queued.created = s.request_id, s.spec, s.created
    return Rendered(json_head(200, [s.request_id]), encode(video(queued, opts)))
