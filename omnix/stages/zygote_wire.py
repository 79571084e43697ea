"""The messages between the server and its zygote (``zygote.py``).

Owns their shapes: ``Fork`` (server -> zygote, one per worker, sent with
the worker's output pipe as an ``SCM_RIGHTS`` file descriptor) and
``ZygoteMessage`` (zygote -> server: ``Ready`` once its modules are
imported, ``Forked`` for each ``Fork``, ``Exited`` for each child that
ended).  One message is one ``SOCK_SEQPACKET`` packet, msgpack-encoded.
"""

from __future__ import annotations

import msgspec

#: The largest packet either side reads (a worker's environment included).
MAX_MESSAGE = 1 << 20


class Fork(msgspec.Struct, frozen=True, kw_only=True):
    """Start ``omnix worker ARGS`` with exactly ``env`` on ``cpus`` (empty:
    the zygote's).  ``ticket`` pairs the answer with the request."""

    ticket: int
    args: tuple[str, ...]
    env: dict[str, str]
    cpus: tuple[int, ...] = ()


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    pid: int


class Forked(msgspec.Struct, frozen=True, tag="forked"):
    ticket: int
    pid: int


class Exited(msgspec.Struct, frozen=True, tag="exited"):
    """A child ended; ``returncode`` as ``subprocess`` reports it (-N: killed by signal N)."""

    pid: int
    returncode: int


ZygoteMessage = Ready | Forked | Exited
