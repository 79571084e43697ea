"""A real multi-node Ray cluster on this machine, on loopback only, for tests and benches.

Owns ``loopback_cluster``: ``ray.cluster_utils.Cluster`` with a head and
nodes of the resources asked, every node on 127.0.0.1 with a small object
store, no dashboard, and a GCS that declares a silent node dead within
about a second; ``lose_node``: a node's host dying (its raylet removed and
every process of its replicas killed); ``LOOPBACK``: the setting that keeps
Ray's own address choice on 127.0.0.1 (Ray otherwise replaces a loopback
address by the host's routable one), set for this process and every
process it starts (an ``omnix serve`` subprocess).  It ends only what it
started (``Cluster.shutdown``), never ``ray stop``, which ends every Ray
process on the host.  ``python -m omnix.testing.ray_cluster NODES_JSON``
runs one in a process of its own (for settings Ray reads once per process,
such as ``RAY_AUTH_MODE``): it prints the address, then serves until its
stdin closes.  Does not own the placement (``omnix.stages.ray_*``).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

#: Ray reads it at import: with it, Ray's own idea of "this host's address"
#: is 127.0.0.1 (its Windows/macOS default), so nothing leaves loopback.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
os.environ.update(LOOPBACK)

import ray  # noqa: E402  (after the setting above)
from ray._private import ray_constants  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

ray_constants.ENABLE_RAY_CLUSTER = False  # in case ray was imported before this module

_NODE: dict[str, Any] = {
    "node_ip_address": "127.0.0.1",
    "object_store_memory": 80 * 2**20,
}
_FAST_FAILURE = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 300,
    "health_check_failure_threshold": 3,
}


@contextmanager
def loopback_cluster(
    nodes: Iterable[dict[str, float]], *, num_cpus: float = 1, head_cpus: float = 0
) -> Iterator[Cluster]:
    """A head (``head_cpus``, nothing else) and one node per entry of
    ``nodes`` (its custom resources, ``num_cpus`` each); shut down on exit."""
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **_NODE,
            "num_cpus": head_cpus,
            "include_dashboard": False,
            "_system_config": _FAST_FAILURE,
        },
    )
    try:
        for resources in nodes:
            cluster.add_node(**_NODE, num_cpus=num_cpus, resources=dict(resources))
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def add_node(
    cluster: Cluster, resources: dict[str, float], num_cpus: float = 1, num_gpus: int = 0
) -> Any:
    """One more node offering ``resources`` (and ``num_gpus`` GPUs, which
    Ray counts whether or not the machine has them)."""
    node = cluster.add_node(
        **_NODE, num_cpus=num_cpus, num_gpus=num_gpus, resources=dict(resources)
    )
    cluster.wait_for_nodes()
    return node


def node_of(cluster: Cluster, node_id: str) -> Any:
    """The cluster's node whose Ray node id is ``node_id``."""
    return next(n for n in cluster.list_all_nodes() if n.node_id == node_id)


def lose_node(cluster: Cluster, node_id: str, pids: Iterable[int]) -> None:
    """The host of ``node_id`` dies: its raylet goes without a goodbye and
    ``pids`` (its replicas' actors and workers: on a real host they die
    with it; a removed raylet's workers here outlive it for a while) are
    killed."""
    cluster.remove_node(node_of(cluster, node_id), allow_graceful=False)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def main() -> None:
    import json
    import sys

    with loopback_cluster(json.loads(sys.argv[1])) as cluster:
        print(cluster.address, flush=True)
        sys.stdin.read()  # until the parent closes it (or dies)


if __name__ == "__main__":
    main()
