"""The Ray cluster the ``ray`` placement runs replicas on: joining it,
checking it can hold the stages, reserving their placement groups.

Owns ``connect`` (join the cluster at ``auto``, ``local`` or
``HOST:PORT``; an unreachable one is a ``RuntimeConfigError``),
``check_fit`` (every stage's replica demand against the alive nodes'
resources, *before* anything is reserved: a stage no node can hold is an
error naming the stage and what is missing, never Ray's pending-forever)
and ``reserve`` (one placement group per stage, a bundle per replica,
``PACK``/``SPREAD``, waited for with a bound).  Does not own the actors
(``ray_launcher.py``) nor what a stage asks for
(``omnix.pipelines.placement``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterable

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from omnix.pipelines.config import StageConfig
from omnix.pipelines.placement import replica_demand, stage_placement
from omnix.stages.errors import RuntimeConfigError

log = logging.getLogger("omnix.runtime")


def connect(address: str, namespace: str) -> bool:
    """Join the Ray cluster at ``address`` (``auto``: ``RAY_ADDRESS`` or the
    cluster ``ray start`` made on this host; ``local``: start one here);
    True when this call connected (its caller disconnects at the end),
    False when this process was connected already."""
    if ray.is_initialized():
        return False
    if address != "local":
        address = _reachable(address)
    try:
        ray.init(
            address=None if address == "local" else address,
            namespace=namespace,
            include_dashboard=False,
            log_to_driver=True,
            logging_level=logging.WARNING,
        )
    except (ConnectionError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeConfigError(
            f"--placement ray: cannot join the Ray cluster at {address!r} ({first}); start one "
            "with `ray start --head` (and `ray start --address HEAD:6379` on the other hosts) "
            "or give --ray-address HOST:PORT"
        ) from None
    return True


def _reachable(address: str) -> str:
    """``address`` as ``HOST:PORT`` (``auto`` resolved as Ray does) once its
    GCS port answers; ``RuntimeConfigError`` otherwise, in seconds (Ray's
    own connect retries for minutes)."""
    from ray._private.services import canonicalize_bootstrap_address

    hint = (
        "start one with `ray start --head` (and `ray start --address HEAD:6379` on the other "
        "hosts) or give --ray-address HOST:PORT"
    )
    try:
        found = canonicalize_bootstrap_address(address)
    except Exception as exc:
        raise RuntimeConfigError(
            f"--placement ray: no Ray cluster at {address!r} ({exc}); {hint}"
        ) from None
    if not found:
        raise RuntimeConfigError(f"--placement ray: no Ray cluster at {address!r}; {hint}")
    host, _, port = found.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5.0).close()
    except (OSError, ValueError) as exc:
        raise RuntimeConfigError(
            f"--placement ray: the Ray cluster at {address!r} ({found}) does not answer "
            f"({getattr(exc, 'strerror', None) or exc}); {hint}"
        ) from None
    return found


def node_ip() -> str:
    """The address the cluster knows this process's node by."""
    return str(ray.util.get_node_ip_address())


def alive_nodes() -> list[dict[str, float]]:
    """The total resources of each alive node."""
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def _fits(node: dict[str, float], demand: dict[str, float]) -> int:
    """How many replicas of ``demand`` one node holds (a large number for
    a demand of nothing)."""
    counts = [int(node.get(k, 0.0) // v) for k, v in demand.items() if v > 0]
    return min(counts) if counts else 1 << 30


def check_fit(stages: Iterable[StageConfig], nodes: list[dict[str, float]]) -> None:
    """``RuntimeConfigError`` naming every stage that no node of ``nodes``
    can hold one replica of (and what is missing), or whose replicas do not
    all fit on the nodes together."""
    problems = []
    offered = sorted({k for n in nodes for k in n if not k.startswith("node:")})
    for st in stages:
        demand = replica_demand(st)
        shown = ", ".join(f"{k}={v:g}" for k, v in demand.items()) or "nothing"
        room = sum(_fits(n, demand) for n in nodes)
        if room == 0:
            missing = [k for k, v in demand.items() if not any(n.get(k, 0.0) >= v for n in nodes)]
            why = (
                f"no node offers {', '.join(missing)}"
                if missing
                else "no single node offers all of it"
            )
            problems.append(
                f"stage {st.name!r} asks for {shown} per replica, and {why} (the cluster's "
                f"{len(nodes)} nodes offer {', '.join(offered) or 'nothing'}): start a node "
                "that does (`ray start --resources '{\"NAME\": 1}'`) or change the stage's "
                "placement table"
            )
        elif room < st.min_replicas:
            problems.append(
                f"stage {st.name!r} starts {st.min_replicas} replicas of {shown} each, and the "
                f"cluster's nodes hold {room}: add nodes or lower replicas"
            )
    if problems:
        raise RuntimeConfigError("--placement ray: " + "; ".join(problems))


async def reserve(stage: StageConfig, timeout_s: float) -> PlacementGroup:
    """The stage's placement group (a bundle per replica), once Ray has
    reserved it; ``RuntimeConfigError`` when it cannot within ``timeout_s``
    (other jobs hold the resources)."""
    p = stage_placement(stage)
    bundle = replica_demand(stage) or {"CPU": 0.001}  # a bundle may not be empty
    pg = placement_group(
        # A stage that scales reserves what it starts with; replicas it adds
        # are placed by their resources alone.
        [dict(bundle) for _ in range(stage.min_replicas)],
        strategy=p.strategy,
        name=f"omnix-{stage.name}",
    )
    try:
        await asyncio.wait_for(pg.ready(), timeout_s)
    except TimeoutError:
        remove_placement_group(pg)
        raise RuntimeConfigError(
            f"--placement ray: Ray did not reserve stage {stage.name!r}'s {stage.min_replicas} "
            f"replicas ({bundle} each, {p.strategy}) within {timeout_s:.0f} s: the nodes that "
            "offer them are busy with other work"
        ) from None
    return pg


def release(pgs: Iterable[PlacementGroup]) -> None:
    for pg in pgs:
        try:
            remove_placement_group(pg)
        except Exception as exc:  # the cluster went away first
            log.debug("could not remove placement group %s: %s", pg.id, exc)
