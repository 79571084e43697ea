"""Who may join the stage runtime: HELLO -> WELCOME -> READY.

Owns: ``Handshake``, the runtime's side of a worker's joining.  A HELLO is
checked (protocol version, the shared worker token, a known stage, a free
replica: the one a spawned worker was started for, the one a hand-started
worker asks for, or the first free one), answered with a WELCOME (the
stage's config and the liveness settings) or a REFUSED naming why; a
repeated HELLO of a worker still joining gets the same answer on its new
connection.  A READY makes the replica take work and emits
``WorkerJoined``.  Also ``private_endpoint``: whether only this host can
connect (a public endpoint requires a worker token).

Does not own the processes (``spawner.py``), liveness after the welcome
(``liveness.py``), nor what a worker that fails to load means
(``runtime.py``).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections.abc import Callable
from pathlib import Path

from omnix.events.types import Event, WorkerJoined
from omnix.pipelines.config import PipelineConfig
from omnix.stages.slots import Slot, SlotTable
from omnix.stages.wire import Wire
from omnix.transport import messages as m

log = logging.getLogger("omnix.runtime")


class Handshake:
    def __init__(
        self,
        pipeline: PipelineConfig,
        slots: SlotTable,
        wire: Wire,
        *,
        spawned_stages: frozenset[str],
        worker_token: str | None,
        heartbeat_interval_s: float,
        lost_after_s: float,
        profile_dir: Path | None,
        emit: Callable[[Event], None],
        changed: Callable[[], None],
    ) -> None:
        self.pipeline = pipeline
        self._slots = slots
        self._wire = wire
        self.spawned_stages = spawned_stages
        self.worker_token = worker_token
        self.heartbeat_interval_s = heartbeat_interval_s
        self.lost_after_s = lost_after_s
        self.profile_dir = profile_dir
        self._emit = emit
        self._changed = changed

    def refuse(self, identity: bytes, reason: str, hello: m.Hello | None = None) -> None:
        who = (
            f" (stage {hello.stage!r}, pid {hello.pid} on {hello.host or 'an unnamed host'})"
            if hello
            else ""
        )
        log.warning("refused a worker%s: %s", who, reason)
        self._wire.send_raw(identity, m.REFUSED, m.Refused(reason))

    def on_hello(self, identity: bytes, hello: m.Hello) -> None:
        if (why := self._unwelcome(hello)) is not None:
            return self.refuse(identity, why, hello)
        known = self._slots.by_token.get(hello.token)
        if known is not None:
            if known.state != "joining" or known.stage != hello.stage:
                return self.refuse(identity, "a worker with this token has already joined", hello)
            # The same worker again (its attempt timed out before our answer
            # reached it): the same answer, on its new connection.
            self._slots.rebind(known, identity)
            return self.welcome(known)
        slot = self._free_slot(hello)
        if isinstance(slot, str):
            return self.refuse(identity, slot, hello)
        slot.state = "joining"
        slot.pid = hello.pid
        slot.last_seen = slot.welcomed_at = time.monotonic()
        self._slots.bind(slot, identity, hello.token)
        self.welcome(slot)
        log.debug("welcomed %s (pid %d)", slot.worker_id, hello.pid)

    def _unwelcome(self, hello: m.Hello) -> str | None:
        """Why no worker saying ``hello`` may join (None: it may)."""
        if hello.protocol != m.PROTOCOL_VERSION:
            return (
                f"protocol version {hello.protocol} differs from the server's "
                f"{m.PROTOCOL_VERSION}; run the same omnix version on both sides"
            )
        if self.worker_token is not None and not hmac.compare_digest(
            hello.auth.encode(), self.worker_token.encode()
        ):
            return (
                "wrong worker token" if hello.auth else "this server requires a worker token"
            ) + "; pass the server's with --worker-token or OMNIX_WORKER_TOKEN"
        return None

    def _free_slot(self, hello: m.Hello) -> Slot | str:
        """The slot a new worker takes, or why there is none for it."""
        slots = self._slots.by_stage.get(hello.stage)
        if slots is None:
            return (
                f"pipeline {self.pipeline.name!r} has no stage {hello.stage!r} "
                f"(stages: {', '.join(self._slots.by_stage)})"
            )
        if hello.stage in self.spawned_stages:
            slot = next(
                (s for s in slots if s.expected_token == hello.token and s.state == "starting"),
                None,
            )
            if slot is None:
                return (
                    f"the workers of stage {hello.stage!r} are spawned by this server itself; "
                    "hand-started workers join the stages it does not spawn (omnix serve --spawn)"
                )
            return slot
        if hello.replica >= 0:
            if hello.replica >= len(slots):
                return (
                    f"stage {hello.stage!r} has replicas 0..{len(slots) - 1}, not {hello.replica}"
                )
            slot = slots[hello.replica]
            if slot.state != "down":
                return (
                    f"replica {hello.replica} of stage {hello.stage!r} already has a worker "
                    f"(pid {slot.pid}, {slot.state}); pick another --replica or omit it"
                )
            return slot
        slot = next((s for s in slots if s.state == "down"), None)
        if slot is None:
            return (
                f"all {len(slots)} replicas of stage {hello.stage!r} have workers; raise "
                "`replicas` in the pipeline config to add more"
            )
        return slot

    def welcome(self, slot: Slot) -> None:
        welcome = m.Welcome(
            replica=slot.replica,
            config=slot.config,
            pipeline=self.pipeline.name,
            heartbeat_interval_s=self.heartbeat_interval_s,
            server_lost_after_s=max(10.0, 5 * self.lost_after_s),
            profile_dir=str(self.profile_dir / slot.stage / str(slot.replica))
            if self.profile_dir
            else "",
        )
        self._wire.send_to(slot, m.WELCOME, welcome)

    def on_ready(self, identity: bytes, ready: m.Ready) -> None:
        slot = self._slots.by_identity.get(identity)
        if slot is None or slot.token != ready.token or slot.state != "joining":
            return self.refuse(identity, "READY from a worker that is not joining; say HELLO first")
        slot.state = "ready"
        slot.capacity = ready.capacity
        slot.engine = ready.engine
        slot.ready = ready
        slot.last_seen = slot.joined_at = time.monotonic()
        slot.failures = 0
        self._emit(
            WorkerJoined(
                worker_id=slot.worker_id,
                stage=slot.stage,
                replica=slot.replica,
                engine=ready.engine,
                capacity=ready.capacity,
                pid=slot.pid,
            )
        )
        self._changed()


def private_endpoint(endpoint: str) -> bool:
    """Whether only this host can connect: ipc, or tcp on a loopback address."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://") :].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a wildcard (*), an interface or a host name: reachable from elsewhere
