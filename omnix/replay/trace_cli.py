"""``omnix trace``: export requests from a server's log as a trace file.

Owns: the verb's arguments.  ``omnix trace export --log-dir DIR --request
ID [-o FILE]`` writes the same bytes as ``GET /v1/requests/ID/trace`` and
``export_trace`` (``omnix.trace``), which does the work; ``--all``
exports the whole log.  ``omnix trace info TRACE`` prints a trace's
header without replaying it.  The log is read offline (no lock), so this
works beside a running server.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omnix.usage import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_cmd", metavar="COMMAND", required=True)
    ex = sub.add_parser("export", help="write a trace of one or more requests")
    ex.set_defaults(_prog=ex.prog)
    ex.add_argument(
        "--log-dir",
        required=True,
        metavar="DIR",
        help="the server's --log-dir (holds events/, blobs/, pipeline.json)",
    )
    ex.add_argument(
        "--request",
        action="append",
        default=[],
        metavar="ID",
        help="request to export (repeatable)",
    )
    ex.add_argument(
        "--session",
        default="",
        metavar="ID",
        help="a /v1/realtime session to export whole: its events and its responses (sess_...)",
    )
    ex.add_argument("--all", action="store_true", help="export the whole log")
    ex.add_argument(
        "--rules",
        type=int,
        default=None,
        help="decision rules the server ran (default: what the server recorded in DIR/server.json)",
    )
    ex.add_argument(
        "-o", "--output", metavar="FILE", help="output file (default: ID.trace; - for stdout)"
    )
    info = sub.add_parser("info", help="print a trace's versions, requests and size")
    info.set_defaults(_prog=info.prog)
    info.add_argument("trace", metavar="TRACE")


def run(args: argparse.Namespace) -> int:
    from omnix.trace import TraceError

    try:
        if args.trace_cmd == "info":
            return _info(args)
        return _export(args)
    except TraceError as exc:
        raise UsageError(str(exc)) from None


def _export(args: argparse.Namespace) -> int:
    from omnix.trace import export_from_dir, write_trace

    if (bool(args.request) or bool(args.session)) == bool(args.all):
        raise UsageError("give --request ID (repeatable), --session ID, or --all")
    data = export_from_dir(
        args.log_dir,
        None if args.all else args.request,
        rules_version=args.rules,
        session=args.session,
    )
    name = args.session or (args.request[0] if args.request else "log")
    out = args.output or f"{name}.trace"
    if out == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        write_trace(out, data)
    except OSError as exc:
        raise UsageError(f"--output {out}: cannot write it ({exc.strerror or exc})") from None
    print(f"wrote {out} ({len(data)} bytes)", file=sys.stderr)
    return 0


def _info(args: argparse.Namespace) -> int:
    from omnix.trace import read_trace

    t = read_trace(Path(args.trace))
    f = t.fold()
    print(f"trace         {t.source}")
    print(f"format        v{t.format_version} (event schema v{t.schema_version})")
    print(f"omnix         {t.omnix_version}")
    print(f"rules         v{t.rules_version}")
    print(f"pipeline      {t.pipeline.name}: {' -> '.join(s.name for s in t.pipeline.stages)}")
    print(f"targets       {', '.join(t.targets) or '(whole log)'}")
    print(
        f"requests      {len(f.requests)}: {', '.join(t.request_ids[:8])}{' ...' if len(f.requests) > 8 else ''}"
    )
    print(f"events        {len(t.events)} ({t.decisions} decisions)")
    print(f"blobs         {len(t.blobs.digests())}")
    print(f"digest        {t.digest} (verified)")
    print(f"source log    positions {', '.join(f'{a}..{a + n - 1}' for a, n in t.origin)}")
    return 0
