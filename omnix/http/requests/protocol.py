"""The bodies of omnix's request routes, as msgspec Structs."""

from __future__ import annotations

import msgspec


class CancelResult(msgspec.Struct, kw_only=True):
    request_id: str
    #: True when this call asked to cancel; False when it had already ended.
    cancel_requested: bool
    status: str
