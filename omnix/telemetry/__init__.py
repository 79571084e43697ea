"""omnix.telemetry: OpenTelemetry traces and metrics as a projection of the log.

Owns nothing itself; re-exports the public surface:

  * ``Telemetry`` (``setup.py``): ``Telemetry.from_env(pipeline)``,
    ``.run(log)`` / ``.catch_up(log)`` / ``.observe(ev)``, ``.shutdown()``.
  * ``metrics_handler`` / ``render_metrics`` (``http.py``): GET /metrics.
  * ``Projection`` (``projection.py``), ``INSTRUMENTS`` (``metrics.py``).

Nothing outside this package records telemetry: spans and metrics are
derived from events, so an old trace yields the same ones as the live log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omnix.telemetry.metrics import INSTRUMENTS, MetricSet
from omnix.telemetry.projection import Projection
from omnix.telemetry.setup import OtlpConfig, Telemetry

if TYPE_CHECKING:
    from omnix.telemetry.http import Handler


def metrics_handler(telemetry: Telemetry) -> Handler:
    """Lazy re-export of ``omnix.telemetry.http.metrics_handler`` (keeps
    aiohttp out of importers that only need the projection)."""
    from omnix.telemetry.http import metrics_handler as _handler

    return _handler(telemetry)


def render_metrics(telemetry: Telemetry, accept: str = "") -> tuple[str, bytes]:
    return telemetry.prometheus_text(accept)


__all__ = [
    "INSTRUMENTS",
    "MetricSet",
    "OtlpConfig",
    "Projection",
    "Telemetry",
    "metrics_handler",
    "render_metrics",
]
