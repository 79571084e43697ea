"""``omnix telemetry --trace FILE``: re-emit the spans and metrics of a captured trace.

Owns: the verb.  It reads a trace (``omnix.trace.read_trace``), feeds
its events in order to the same projection a live server runs
(``Telemetry.observe``), then:

  * ``--otlp-endpoint URL`` (or the standard ``OTEL_EXPORTER_OTLP_*``
    variables): exports the spans (with their recorded times) and one
    metrics snapshot over OTLP, then exits;
  * ``--prometheus-port N``: serves /metrics on ``--host`` (default
    127.0.0.1) until interrupted, for a Prometheus to scrape;
  * ``--print`` (the default when neither of the above is given): prints
    the Prometheus exposition to stdout;
  * ``--spans``: prints the spans as JSON lines to stdout.

Does not own the trace format (``omnix.trace``) or the projection.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from omnix.usage import UsageError, int_in, port_number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace", required=True, metavar="FILE", help="a trace file (omnix trace export)"
    )
    parser.add_argument(
        "--otlp-endpoint", metavar="URL",
        help="OTLP endpoint for spans and metrics (default: OTEL_EXPORTER_OTLP_* if set)",
    )  # fmt: skip
    out = parser.add_mutually_exclusive_group()
    out.add_argument(
        "--prometheus-port", type=port_number, metavar="N",
        help="serve /metrics on this port until interrupted",
    )  # fmt: skip
    out.add_argument(
        "--print", action="store_true", help="print the Prometheus exposition (default)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address for --prometheus-port")
    parser.add_argument("--spans", action="store_true", help="print the spans as JSON lines")
    parser.add_argument(
        "--sample-rate", type=int_in(1, 10_000_000, "a sample rate"), default=None,
        help="audio samples per second (default: the pipeline's codec stage, else 24000)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from omnix.trace import TraceError, read_trace

    try:
        trace = read_trace(args.trace)
    except (TraceError, OSError) as exc:
        raise UsageError(str(exc)) from None

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from omnix.telemetry.setup import Telemetry, sample_rate_of

    spans = InMemorySpanExporter() if args.spans else None
    tel = Telemetry.from_env(
        trace.pipeline.name,
        otlp_endpoint=args.otlp_endpoint,
        span_exporter=spans,
        sample_rate=args.sample_rate or sample_rate_of(trace.pipeline),
    )
    for ev in trace.events:
        tel.observe(ev)
    proj = tel.projection
    print(
        f"omnix telemetry: {len(trace.events)} events, {proj.requests_ended} requests ended "
        f"(pipeline {trace.pipeline.name}); "
        + (f"OTLP to {_where(tel)}" if tel.otlp and tel.otlp.enabled else "no OTLP endpoint"),
        file=sys.stderr,
    )
    try:
        if spans is not None:
            tel.force_flush()
            for span in spans.get_finished_spans():
                print(json.dumps(json.loads(span.to_json()), separators=(",", ":")))
        if args.prometheus_port is not None:
            return _serve(tel, args.host, args.prometheus_port)
        if args.print or (not (tel.otlp and tel.otlp.enabled) and not args.spans):
            _, body = tel.prometheus_text()
            sys.stdout.write(body.decode())
        return 0
    finally:
        # Flushes the batch span processor and does the final metric export.
        tel.shutdown()


def _where(tel: Any) -> str:
    o = tel.otlp
    return ", ".join(x for x in (o.traces_endpoint, o.metrics_endpoint) if x)


def _serve(tel: Any, host: str, port: int) -> int:
    from omnix.telemetry.http import serve_metrics

    async def main() -> None:
        try:
            runner, bound = await serve_metrics(tel, host, port)
        except OSError as exc:
            raise UsageError(
                f"cannot serve /metrics on {host}:{port} ({exc.strerror or exc}): "
                "pick a free --prometheus-port (0: any free one) or another --host"
            ) from None
        print(
            f"omnix telemetry: serving http://{host}:{bound}/metrics (Ctrl-C to stop)",
            file=sys.stderr,
        )
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    return 0
