"""Where the stage runtime's workers connect.

Owns: choosing the workers endpoint a ``StageRuntime`` binds: the one its
options name, or a fresh private ``ipc://`` one (and the folder to remove
at shutdown); under Ray a ``tcp://`` one the cluster's nodes reach; and
refusing an endpoint other hosts can reach when no worker token guards
it.  Does not own binding it (``transport.sockets.make_router``) nor who
may join through it (``handshake.py``).
"""

from __future__ import annotations

from omnix.stages.errors import RuntimeConfigError
from omnix.stages.handshake import private_endpoint
from omnix.transport.sockets import default_ipc_endpoint


def ray_endpoint(endpoint: str | None, node_ip: str) -> str:
    """Under Ray, workers connect from the cluster's nodes: a tcp endpoint,
    by default on the address the cluster knows this host by."""
    if endpoint is None:
        return f"tcp://{node_ip}:0"
    if not endpoint.startswith("tcp://"):
        raise RuntimeConfigError(
            f"--placement ray: workers on the Ray cluster's nodes cannot reach {endpoint}: give "
            "a tcp workers endpoint (tcp://HOST:PORT) or none"
        )
    return endpoint


def workers_endpoint(endpoint: str | None, worker_token: str | None) -> tuple[str, str | None]:
    """The workers' endpoint (a fresh ipc one when None) and the directory
    to remove at shutdown; a public one without a worker token is an error."""
    tmpdir = None
    if endpoint is None:
        endpoint, tmpdir = default_ipc_endpoint()
    if worker_token is None and not private_endpoint(endpoint):
        raise RuntimeConfigError(
            f"workers endpoint {endpoint} accepts connections from other hosts: set a shared "
            "worker token (--worker-token or OMNIX_WORKER_TOKEN on the server and on every "
            "worker), or bind a loopback address such as tcp://127.0.0.1:PORT"
        )
    return endpoint, tmpdir
