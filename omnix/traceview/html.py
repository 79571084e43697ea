"""A trace as one self-contained HTML page (``omnix replay TRACE --html FILE``).

Owns: ``render_html``: the trace header, per request its timings (TTFT,
TTFP, E2EL), a stage table, an inline-SVG waterfall (the same bars as the
terminal's: routed/waiting, started/no output, producing) and the event
list.  Inline CSS and SVG only: no script, font, image or stylesheet is
fetched, so the file can be attached to a bug report and opened anywhere.

Does not own the timings (``show.request_timing``) or any replay.
"""

from __future__ import annotations

from html import escape

from omnix.events.reducer import RequestState
from omnix.events.types import Routed
from omnix.trace import Trace, is_decision
from omnix.traceview.show import MS, RequestTiming, _n, describe, request_timing

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2430;background:#fbfbfd}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 6px}
.meta{color:#5b6474;font-size:13px} .ok{color:#137333;font-weight:600}
.card{background:#fff;border:1px solid #e3e6ec;border-radius:8px;padding:14px 16px;margin:14px 0}
.kpis{display:flex;gap:22px;margin:8px 0 10px} .kpi b{display:block;font-size:18px}
.kpi span{color:#5b6474;font-size:12px;text-transform:uppercase;letter-spacing:.04em}
table{border-collapse:collapse;font-size:13px;margin:6px 0} td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #eef0f4}
th{color:#5b6474;font-weight:600} td:first-child,th:first-child{text-align:left}
.status-finished{color:#137333} .status-failed,.status-lost{color:#b3261e} .status-aborted,.status-cancelled{color:#8a5a00}
.legend span{display:inline-block;width:12px;height:10px;margin:0 4px 0 12px;vertical-align:middle;border-radius:2px}
pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace;background:#f4f5f8;padding:10px;border-radius:6px;overflow:auto;max-height:420px}
.dec{color:#3949ab}
"""

_WAIT, _IDLE, _BUSY = "#c9d3e6", "#8fa6d6", "#2f5fbf"


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / MS:.3f} ms"


def _svg(tm: RequestTiming, end_ns: int, width: int = 820) -> str:
    label_w, row_h, pad = 120, 22, 8
    plot_w = width - label_w - 160  # room on the right for "123.45 ms finished"
    span = max(end_ns, 1)
    h = pad * 2 + row_h * len(tm.stages) + 40

    def x(ns: int | None) -> float:
        return label_w + plot_w * min(max((ns or 0) / span, 0.0), 1.0)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" '
        f'viewBox="0 0 {width} {h}" role="img" aria-label="stage waterfall">'
    ]
    for i, s in enumerate(tm.stages):
        y = pad + i * row_h
        parts.append(
            f'<text x="4" y="{y + 15}" font-size="12" fill="#1d2430">{escape(s.name)}/{s.replica}</text>'
        )
        end = (
            s.ended
            if s.ended is not None
            else (s.last_chunk if s.last_chunk is not None else end_ns)
        )
        routed = s.routed or 0
        started = s.started if s.started is not None else end
        first = s.first_chunk if s.first_chunk is not None else end
        for a, b, color, what in (
            (routed, started, _WAIT, "routed, waiting to start"),
            (started, first, _IDLE, "started, no output yet"),
            (first, end, _BUSY, "producing output"),
        ):
            if b > a or (what == "producing output" and b == a and s.chunks):
                w = max(x(b) - x(a), 1.5)
                parts.append(
                    f'<rect x="{x(a):.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" '
                    f'rx="2" fill="{color}"><title>{escape(s.name)} {what}: '
                    f"{(b - a) / MS:.3f} ms</title></rect>"
                )
        parts.append(
            f'<text x="{label_w + plot_w + 8}" y="{y + 15}" font-size="11" fill="#5b6474">'
            f"{(end - routed) / MS:.2f} ms {escape(s.status)}</text>"
        )
    base = pad + row_h * len(tm.stages)
    parts.append(
        f'<line x1="{label_w}" y1="{base + 2}" x2="{label_w + plot_w}" y2="{base + 2}" stroke="#aab2c0"/>'
    )
    parts.append(f'<text x="{label_w}" y="{base + 18}" font-size="11" fill="#5b6474">0</text>')
    parts.append(
        f'<text x="{label_w + plot_w}" y="{base + 18}" font-size="11" fill="#5b6474" '
        f'text-anchor="end">{span / MS:.3f} ms</text>'
    )
    for label, ns, color in (
        ("TTFT", tm.ttft, "#137333"),
        ("TTFP", tm.ttfp, "#8a5a00"),
        ("E2EL", tm.e2el, "#b3261e"),
    ):
        if ns is None:
            continue
        parts.append(
            f'<line x1="{x(ns):.1f}" y1="{pad}" x2="{x(ns):.1f}" y2="{base + 2}" stroke="{color}" '
            f'stroke-dasharray="3 3"><title>{label} {ns / MS:.3f} ms</title></line>'
        )
        parts.append(
            f'<text x="{x(ns) + 2:.1f}" y="{base + 32}" font-size="10" fill="{color}">{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def render_html(trace: Trace, *, requests: list[str] | None = None, max_events: int = 5000) -> str:
    f = trace.fold()
    t0 = trace.events[0].ts_ns if trace.events else 0
    stages = " → ".join(st.name for st in trace.pipeline.stages)
    title = f"omnix trace: {', '.join(trace.targets) or 'whole log'}"
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<div class="meta">{escape(trace.source)} · format v{trace.format_version} · omnix '
        f"{escape(trace.omnix_version)} · event schema v{trace.schema_version} · rules "
        f"v{trace.rules_version} · pipeline <b>{escape(trace.pipeline.name)}</b> ({escape(stages)})<br>"
        f"{_n(len(trace.events), 'event')} ({_n(trace.decisions, 'decision')}) · "
        f"{_n(len(f.requests), 'request')} · "
        f'{_n(len(f.workers), "worker")} · state digest <code>{trace.digest}</code> <span class="ok">'
        "re-folded: matches</span></div>",
        f'<div class="legend meta">waterfall: <span style="background:{_WAIT}"></span>routed, '
        f'waiting to start<span style="background:{_IDLE}"></span>started, no output yet'
        f'<span style="background:{_BUSY}"></span>producing output</div>',
    ]
    for rid in requests or trace.request_ids:
        rs = f.requests.get(rid)
        if rs is not None:
            body.extend(_card(trace, rs))
    lines = []
    for ev in trace.events[:max_events]:
        text = escape(describe(ev, t0))
        lines.append(f'<span class="dec">{text}</span>' if is_decision(ev) else text)
    more = len(trace.events) - max_events
    if more > 0:
        lines.append(f"… {more} more events (omnix replay TRACE --events prints them all)")
    body.append(
        '<h2>events</h2><div class="meta">decisions in blue</div><pre>'
        + "\n".join(lines)
        + "</pre>"
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )


def _card(trace: Trace, rs: RequestState) -> list[str]:
    """One request's card: its outcome, KPIs, stage waterfall and table."""
    out: list[str] = []
    tm = request_timing(rs)
    how = rs.status + (f" ({rs.reason})" if rs.reason else "")
    if not rs.terminal:
        how += " — still live where the trace ends"
    target = " · target" if rs.request_id in trace.targets else ""
    out.append('<div class="card">')
    out.append(
        f'<h2>{escape(rs.request_id)} <span class="status-{escape(rs.status)}">{escape(how)}</span>'
        f'<span class="meta">{target}</span></h2>'
    )
    out.append('<div class="kpis">')
    for label, ns in (("TTFT", tm.ttft), ("TTFP", tm.ttfp), ("E2EL", tm.e2el)):
        out.append(f'<div class="kpi"><span>{label}</span><b>{_ms(ns)}</b></div>')
    out.append(f'<div class="kpi"><span>events</span><b>{rs.events}</b></div></div>')
    if tm.stages:
        end = tm.e2el
        if end is None:
            end = max((s.ended or s.last_chunk or s.started or s.routed or 0) for s in tm.stages)
        out.append(_svg(tm, end))
        out.append(
            "<table><tr><th>stage</th><th>routed</th><th>started</th><th>first output</th>"
            "<th>last output</th><th>ended</th><th>chunks</th><th>status</th></tr>"
        )
        for s in tm.stages:
            out.append(
                f"<tr><td>{escape(s.name)}/{s.replica}</td><td>{_ms(s.routed)}</td>"
                f"<td>{_ms(s.started)}</td><td>{_ms(s.first_chunk)}</td>"
                f"<td>{_ms(s.last_chunk)}</td><td>{_ms(s.ended)}</td><td>{s.chunks}</td>"
                f'<td class="status-{escape(s.status)}">{escape(s.status)}'
                f"{' (' + escape(s.finish_reason) + ')' if s.finish_reason else ''}</td></tr>"
            )
        out.append("</table>")
        for ev in trace.events:
            if type(ev) is Routed and ev.resume and ev.request_id == rs.request_id:
                out.append(
                    f'<div class="meta">continuation: {escape(ev.stage)} moved to '
                    f"{escape(ev.stage)}/{ev.replica} at #{ev.pos}, after its "
                    f"{_n(ev.resume, 'chunk')} (cause #{ev.cause})</div>"
                )
    out.append("</div>")
    return out
