"""``omnix worker``: run one stage worker and join a stage runtime.

Owns: the command line of a worker process (``add_arguments``/``run``) and
the process-level setup that must happen before any engine is imported
(thread limits, logging, the event loop).  The runtime spawns workers with
``python -m omnix.stages.worker_cli``; a person or a process manager starts
them by hand with::

    omnix worker --connect tcp://SERVER:PORT --stage talker [--replica 1]

Everything else (the engine and its arguments) comes from the server in the
handshake.  Does not own the worker's behaviour (``omnix.stages.worker``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--connect", required=True, metavar="ENDPOINT",
        help="the stage runtime's endpoint: tcp://HOST:PORT (or ipc://PATH on the same host)",
    )
    parser.add_argument("--stage", required=True, help="the pipeline stage this worker serves")
    parser.add_argument(
        "--replica", type=int, default=-1,
        help="which replica to be (default: the server assigns a free one)",
    )
    parser.add_argument(
        "--hello-timeout", type=float, default=60.0, metavar="S",
        help="give up if the server does not answer the handshake within S seconds",
    )
    parser.add_argument("--log-level", default=os.environ.get("OMNIX_LOG_LEVEL", "INFO"))


def run(args: argparse.Namespace) -> int:
    # Before any engine (and so torch) is imported: one OpenMP thread unless
    # the operator chose otherwise (a streaming loop and torch's thread pool
    # fight for cores on small machines; see docs/runtime.md).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s worker[{args.stage}/{args.replica}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from omnix.stages.worker import PARENT_ENV, TOKEN_ENV, Worker

    worker = Worker(
        args.connect,
        args.stage,
        args.replica,
        token=os.environ.pop(TOKEN_ENV, None) or None,
        parent_pid=int(os.environ.pop(PARENT_ENV, "0") or 0),
        hello_timeout_s=args.hello_timeout,
    )
    return _run_loop(worker.run())


def _run_loop(coro) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnix worker", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
