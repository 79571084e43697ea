"""``omnix replay``: replay a captured trace in one of its modes.

Owns: the verb's arguments and the choice of mode, ``--set`` overrides of
a pipeline config, exit codes and what each mode prints.  The modes live
in their modules: fold-and-show (``omnix.traceview``), drive
(``drive.py``), counterfactual (``counterfactual.py``), fault injection
(``faults.py``), client bytes (``client.py``).  Recapturing the corpus is
test support (``python -m omnix.testing.corpus``).

    omnix replay TRACE                         fold, verify the digest, show the timeline
    omnix replay TRACE --html page.html        ... and write the same as one HTML page
    omnix replay TRACE --drive                 the real orchestrator against the record
    omnix replay TRACE --config other.toml     counterfactual: which decisions change
    omnix replay TRACE --set edges.1.every=4   ... the same with one setting changed
    omnix replay TRACE --inject worker-lost@40 fault injection, invariants checked
    omnix replay TRACE --client-bytes -o body  the exact bytes the client received

Exit status: 0 fine; 1 a divergence (``--drive``) or a broken invariant
(``--inject``); 2 a trace or argument that cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from omnix.pipelines.config import PipelineConfig
from omnix.usage import UsageError, count

if TYPE_CHECKING:  # the modes import what they use when they run
    from omnix.trace import Trace


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "modes: (default) fold and show · --drive · --config/--set (counterfactual) · "
        "--inject (faults) · --client-bytes.\n"
        "fault syntax: worker-lost@POS[:STAGE/REPLICA]  slow-stage@POS:STAGE:MS  "
        "cancel@POS[:REQUEST]\n"
        "`python -m omnix.testing.corpus --out replay/` recaptures the corpus (docs/replay.md)."
    )
    parser.add_argument("trace", metavar="TRACE", help="a trace file")
    parser.add_argument(
        "--request",
        action="append",
        default=None,
        metavar="ID",
        help="show only this request (repeatable); picks the request for --client-bytes",
    )
    parser.add_argument("--events", action="store_true", help="also list every event")
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the digest checks on read (forensics on a damaged trace)",
    )
    parser.add_argument("--width", type=count, default=56, help="waterfall width in columns")
    parser.add_argument(
        "--html", metavar="FILE", help="write a self-contained HTML page of the trace"
    )
    parser.add_argument(
        "--drive",
        action="store_true",
        help="run the orchestrator against the recorded inputs; fail at the first divergent decision",
    )
    parser.add_argument(
        "--config",
        metavar="PIPELINE",
        help="counterfactual: drive the recorded inputs under this pipeline (file or built-in name)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="counterfactual: change one setting, e.g. edges.1.every=4 or "
        "stages.talker.timeout_s=1 (repeatable)",
    )
    parser.add_argument(
        "--rules",
        type=int,
        default=None,
        help="orchestrator rules version to drive under (default: the trace's)",
    )
    parser.add_argument(
        "--timers",
        action="store_true",
        help="counterfactual: re-derive deadline/timeout expiries in virtual time "
        "instead of feeding the recorded ones",
    )
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="FAULT",
        help="fault injection (repeatable): worker-lost@POS[:STAGE/REPLICA], "
        "slow-stage@POS:STAGE:MS, cancel@POS[:REQUEST]",
    )
    parser.add_argument(
        "--ack-aborts-ms",
        type=float,
        default=1.0,
        help="fault runs: how long a worker takes to acknowledge an abort",
    )
    parser.add_argument(
        "--client-bytes",
        action="store_true",
        help="regenerate the exact response body (SSE stream) the client received",
    )
    parser.add_argument(
        "-o", "--output", metavar="FILE", help="--client-bytes: write the body here"
    )


def _write(path: str, data: bytes, flag: str) -> None:
    """Write an output file the user named; a folder that is not there or
    not writable is their error, named with its flag."""
    try:
        Path(path).write_bytes(data)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None


def _check_requests(trace: Trace, requested: list[str] | None) -> None:
    """Every ``--request ID`` must be one the trace holds."""
    known = trace.request_ids
    missing = [r for r in requested or () if r not in known]
    if missing:
        shown = ", ".join(known[:8]) + (" ..." if len(known) > 8 else "")
        raise UsageError(
            f"--request {', '.join(missing)}: not in {trace.source} (its requests: {shown or 'none'})"
        )


def apply_overrides(cfg: PipelineConfig, overrides: list[str]) -> PipelineConfig:
    """``edges.1.every=4``, ``stages.talker.replicas=2``, ``abort_timeout_s=0.5``.
    List items are addressed by index or, for stages, by name; values are
    JSON (``4``, ``true``, ``"x"``) or a bare string."""
    from omnix.pipelines.validate import PipelineError, validate_pipeline

    # Through JSON so that tuples become lists (to_builtins keeps tuples).
    data: Any = json.loads(msgspec.json.encode(cfg))
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep or not path:
            raise ValueError(f"--set {item!r}: expected PATH=VALUE, e.g. edges.1.every=4")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = data
        keys = path.split(".")
        for i, key in enumerate(keys):
            last = i == len(keys) - 1
            if isinstance(node, list):
                if key.isdigit() and int(key) < len(node):
                    idx = int(key)
                else:
                    names = [x.get("name") if isinstance(x, dict) else None for x in node]
                    if key not in names:
                        raise ValueError(
                            f"--set {item!r}: no item {key!r} in {'.'.join(keys[:i]) or 'the config'} "
                            f"(indexes 0..{len(node) - 1}{', names ' + ', '.join(map(str, filter(None, names))) if any(names) else ''})"
                        )
                    idx = names.index(key)
                if last:
                    node[idx] = value
                else:
                    node = node[idx]
            elif isinstance(node, dict):
                if last:
                    node[key] = value
                else:
                    if key not in node:
                        node[key] = {}
                    node = node[key]
            else:
                raise ValueError(f"--set {item!r}: {'.'.join(keys[:i])} is a value, not a table")
    try:
        new = msgspec.convert(data, PipelineConfig)
        validate_pipeline(new, "<--set>")
    except (msgspec.ValidationError, PipelineError) as exc:
        raise ValueError(
            f"--set {' '.join(overrides)}: the result is not a valid pipeline: {exc}"
        ) from None
    return new


def run(args: argparse.Namespace) -> int:
    from omnix.trace import TraceError, read_trace

    try:
        trace = read_trace(args.trace, verify=not args.no_verify)
    except TraceError as exc:
        raise UsageError(str(exc)) from None

    try:
        return _modes(trace, args)
    except TraceError as exc:  # e.g. --no-verify on events that do not fold
        raise UsageError(str(exc)) from None


def _modes(trace: Trace, args: argparse.Namespace) -> int:
    _check_requests(trace, args.request)
    pipeline: PipelineConfig | None = None
    try:
        if args.config:
            from omnix.pipelines.validate import load_pipeline

            pipeline = load_pipeline(args.config)
        if args.overrides:
            pipeline = apply_overrides(pipeline or trace.pipeline, args.overrides)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    if args.html:
        from omnix.traceview.html import render_html

        _write(args.html, render_html(trace, requests=args.request).encode(), "--html")
        print(f"wrote {args.html}", file=sys.stderr)

    if args.client_bytes:
        return _client_bytes(trace, args)
    if args.inject:
        return _faults(trace, args, pipeline)
    if args.drive:
        return _drive(trace, args, pipeline)
    if pipeline is not None or args.rules is not None:
        from omnix.replay.counterfactual import counterfactual

        try:
            cf = counterfactual(trace, pipeline=pipeline, rules=args.rules, timers=args.timers)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        sys.stdout.write(cf.report(trace))
        return 0
    if not args.html or args.events or args.request:
        from omnix.traceview.show import render_timeline

        sys.stdout.write(
            render_timeline(trace, requests=args.request, events=args.events, width=args.width)
        )
    return 0


def _drive(trace: Trace, args: argparse.Namespace, pipeline: PipelineConfig | None) -> int:
    import time

    from omnix.replay.drive import drive

    t = time.perf_counter()
    try:
        res = drive(trace, pipeline=pipeline, rules=args.rules, raise_on_divergence=False)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dt = time.perf_counter() - t
    if res.divergence is not None:
        print(res.divergence.report())
        return 1
    print(
        f"{trace.source}: drove {res.events} events ({res.inputs} inputs, {res.decisions} decisions) "
        f"under rules v{args.rules if args.rules is not None else trace.rules_version} in "
        f"{dt * 1000:.1f} ms: every decision matches the recording byte for byte; "
        f"state digest {res.digest} matches"
    )
    return 0


def _faults(trace: Trace, args: argparse.Namespace, pipeline: PipelineConfig | None) -> int:
    from omnix.replay.faults import FaultError, inject

    try:
        res = inject(
            trace,
            args.inject,
            pipeline=pipeline,
            rules=args.rules,
            ack_aborts_ms=args.ack_aborts_ms,
        )
    except (FaultError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    sys.stdout.write(res.report(trace))
    return 0 if res.ok else 1


def _client_bytes(trace: Trace, args: argparse.Namespace) -> int:
    from omnix.replay.client import client_bytes, pick_request

    try:
        rid = pick_request(trace, args.request[0] if args.request else None)
        body = client_bytes(trace, rid)
    except (KeyError, ValueError) as exc:
        raise UsageError(str(exc).strip("'\"")) from None
    if args.output:
        _write(args.output, body, "--output")
        print(f"wrote {len(body)} bytes of {rid}'s response body to {args.output}", file=sys.stderr)
    else:
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
    return 0
