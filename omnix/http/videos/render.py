"""A video job's ``Video`` object, as a pure function of its request's events.

Owns ``VideoFold`` and ``video``: the job as its events so far show it
(``queued`` until the video stage starts, ``in_progress`` with
``progress`` = the stage's last ``Progress`` step over its total,
``completed`` at ``Finished``, ``failed`` with the error at ``Failed``,
``Cancelled`` or ``Rejected``; ``restarts``: how often the stage was
routed again from step 0, after a server restarted mid-job); and
``whole``: what ``POST /v1/videos`` answered, the job as admitted
(``queued``, progress 0), so a replay renders the bytes the client got.

Does not own the dispatch over APIs nor the entry points
(``omnix.http.render``), nor the MP4 (the engine encoded it; the content
route serves the chunk's blob).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from omnix.events.blobs import BlobStore
from omnix.events.options import VideoOptions
from omnix.events.types import (
    Cancelled,
    Event,
    Failed,
    Finished,
    Rejected,
    Routed,
    StageStarted,
)
from omnix.http.common.rendering import Rendered, encode, json_head, terminal_error
from omnix.http.common.summary import RequestSummary
from omnix.http.videos.protocol import Video, VideoError, VideoStatus


class VideoFold:
    """One job's events folded: its summary, whether its video stage
    started, how often it was routed anew."""

    def __init__(self, blobs: BlobStore) -> None:
        self.s = RequestSummary(blobs, collect_media=False)
        self.started = False
        self.routes = 0

    def feed(self, ev: Event) -> None:
        self.s.feed(ev)
        stage = self.s.video_stage
        if type(ev) is StageStarted and ev.stage == stage:
            self.started = True
        elif type(ev) is Routed and ev.stage == stage and ev.seq == 0:
            self.routes += 1


def fold(events: Iterable[Event], blobs: BlobStore) -> VideoFold:
    f = VideoFold(blobs)
    for ev in events:
        f.feed(ev)
    return f


def _message(body: bytes) -> str:
    """The ``message`` of an OpenAI error body."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")


def video(f: VideoFold, opts: VideoOptions, *, retain_s: float | None = None) -> Video:
    """The job ``f`` folded so far; ``retain_s``: the server's retention
    window, which says when a finished job's file goes (``expires_at``)."""
    s = f.s
    status: VideoStatus = "in_progress" if f.started else "queued"
    step, total = s.progress
    progress = min(99, step * 100 // total) if total else 0
    completed_at = expires_at = None
    error = None
    term = s.terminal
    if term is not None:
        completed_at = term.ts_ns // 1_000_000_000
        if retain_s is not None:
            expires_at = int(completed_at + retain_s)
    if isinstance(term, Finished):
        status, progress = "completed", 100
    elif isinstance(term, (Failed, Cancelled, Rejected)):
        status = "failed"
        err = terminal_error(term)
        code = "cancelled" if isinstance(term, Cancelled) else term.reason
        error = VideoError(code=code, message=_message(err[1]) if err is not None else code)
    spec = s.spec
    return Video(
        id=s.request_id,
        model=spec.model if spec is not None else "",
        status=status,
        progress=progress,
        created_at=s.created,
        completed_at=completed_at,
        expires_at=expires_at,
        error=error,
        prompt=spec.prompt if spec is not None else None,
        seconds=opts.seconds,
        size=opts.size,
        fps=opts.fps,
        num_frames=opts.num_frames,
        restarts=max(0, f.routes - 1),
        asked=opts.asked or None,
        request_ids=[s.request_id],
    )


def whole(s: RequestSummary, opts: VideoOptions) -> Rendered:
    """``POST /v1/videos``' answer: the job as admitted."""
    queued = VideoFold(s.blobs)
    queued.s.request_id, queued.s.spec, queued.s.created = s.request_id, s.spec, s.created
    return Rendered(json_head(200, [s.request_id]), encode(video(queued, opts)))
