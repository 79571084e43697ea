"""The bodies of the server's own routes, as msgspec Structs."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from omnix.http.common.fields import REQUEST


class Health(msgspec.Struct, kw_only=True):
    status: Literal["ok"] = "ok"


class Version(msgspec.Struct, kw_only=True):
    """``GET /version``, as vLLM's server answers it."""

    version: str


class Readiness(msgspec.Struct, kw_only=True):
    ready: bool
    accepting: bool
    #: ready replicas per stage
    stages: dict[str, int]


class ProfileRequest(msgspec.Struct, **REQUEST):
    """``POST /start_profile`` and ``/stop_profile`` (vLLM-Omni's shape):
    the stages whose workers to profile; none: every stage."""

    stages: list[Annotated[str, Meta(min_length=1, max_length=128)]] = []


class WorkerProfile(msgspec.Struct, kw_only=True):
    """One worker's answer: where its traces go (start), the file it wrote
    (stop), or what went wrong (``ok`` false)."""

    stage: str
    replica: int
    ok: bool
    detail: str


class Profiles(msgspec.Struct, kw_only=True):
    workers: list[WorkerProfile]
