"""``omnix worker``: run one stage worker and join a stage runtime.

Owns: the command line of a worker process (``add_arguments``/``run``) and
the process-level setup that must happen before any engine is imported
(thread limits, logging, the event loop).  The runtime spawns workers with
``python -m omnix.stages.worker_cli``; a person or a process manager starts
them by hand with::

    omnix worker --connect tcp://SERVER:PORT --stage talker [--replica 1] [--worker-token T]
    omnix worker --connect tcp://LEADER:PORT,tcp://STANDBY:PORT --stage talker

Everything else (the engine and its arguments) comes from the server in the
handshake.  Does not own the worker's behaviour (``omnix.stages.worker``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from collections.abc import Coroutine
from typing import Any

from omnix.transport.sockets import check_endpoints
from omnix.usage import UsageError, arg_type, run_reporting

CPUS_ENV = "OMNIX_WORKER_CPUS"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--connect",
        required=True,
        type=arg_type(check_endpoints, "endpoint"),
        metavar="ENDPOINT[,ENDPOINT...]",
        help="the stage runtime's endpoint: tcp://HOST:PORT (or ipc://PATH on the same host); "
        "several (a replicated log's leader and standbys, docs/multihost.md): the worker joins "
        "the first that answers, and the next when it loses its server",
    )
    parser.add_argument("--stage", required=True, help="the pipeline stage this worker serves")
    parser.add_argument(
        "--replica",
        type=int,
        default=-1,
        help="which replica to be (default: the server assigns a free one)",
    )
    parser.add_argument(
        "--hello-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="give up if the server does not answer the handshake within S seconds",
    )
    parser.add_argument(
        "--worker-token",
        default=None,
        metavar="TOKEN",
        help="the shared secret the server was started with (omnix serve --worker-token); "
        "default: $OMNIX_WORKER_TOKEN",
    )
    parser.add_argument(
        "--reconnect-for",
        type=float,
        default=300.0,
        metavar="S",
        help="when the server stops answering (it died or restarted), keep trying to join one "
        "at the same address for S seconds before exiting with code 5 (default 300; 0: exit at once)",
    )
    parser.add_argument(
        "--cpus",
        default=os.environ.get(CPUS_ENV, ""),
        metavar="LIST",
        help="pin this worker (and every thread it starts) to these CPUs, e.g. 1 or 2-3 or 0,2 "
        f"(default: ${CPUS_ENV}, else no pinning)",
    )
    parser.add_argument("--log-level", default=os.environ.get("OMNIX_LOG_LEVEL", "INFO"))


def parse_cpus(text: str) -> set[int]:
    """``"1"``, ``"2-3"``, ``"0,2-3"`` -> a CPU set (ValueError says what is wrong)."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"bad CPU list {text!r}: use numbers and ranges like 0,2-3") from None
        if a < 0 or b < a:
            raise ValueError(f"bad CPU range {part!r} in {text!r}")
        cpus.update(range(a, b + 1))
    return cpus


def run(args: argparse.Namespace) -> int:
    # Before any engine (and so torch) is imported: one OpenMP thread unless
    # the operator chose otherwise (a streaming loop and torch's thread pool
    # fight for cores on small machines; see docs/runtime.md).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.cpus:
        # First, so that every thread started later (ZMQ's I/O thread,
        # torch's) inherits it: no migrations, and a wakeup between this
        # process's own threads is a same-core switch.
        try:
            os.sched_setaffinity(0, parse_cpus(args.cpus))
        except ValueError as exc:
            raise UsageError(f"cannot pin to CPUs {args.cpus!r}: {exc}") from None
        except OSError as exc:
            usable = ",".join(map(str, sorted(os.sched_getaffinity(0))))
            raise UsageError(
                f"cannot pin to CPUs {args.cpus!r} ({exc.strerror or exc}): "
                f"this process may use CPUs {usable}"
            ) from None
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s worker[{args.stage}/{args.replica}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from omnix.stages.worker import AUTH_ENV, PARENT_ENV, TOKEN_ENV, Worker, exit_without_finalizing
    from omnix.stages.worker_process import FRESH_ENV

    os.environ[FRESH_ENV] = "1"  # nothing computed yet: its engine may fork from here

    # Popped: the engine's own processes need none of these.
    auth = os.environ.pop(AUTH_ENV, "")
    worker = Worker(
        args.connect,
        args.stage,
        args.replica,
        token=os.environ.pop(TOKEN_ENV, None) or None,
        parent_pid=int(os.environ.pop(PARENT_ENV, "0") or 0),
        hello_timeout_s=args.hello_timeout,
        auth=args.worker_token or auth,
        reconnect_for_s=max(0.0, args.reconnect_for),
    )
    code = _run_loop(worker.run())
    if gc.get_freeze_count():  # the engine loaded: see exit_without_finalizing
        exit_without_finalizing(code)
    return code


def _run_loop(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnix worker", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_reporting(parser.prog, lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
