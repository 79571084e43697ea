// One request's timeline, drawn from its events as the log holds them
// (GET /v1/requests/{id}/events, live while it runs): a lane per stage on
// a time axis, the milestones, the event list, then its figures (GET
// /v1/requests/{id}/figures) and the links to its trace.  Every time shown
// is a difference of the log's own ts_ns, never this page's clock.

import { ApiError, call, sse } from "./api.js";

const TERMINAL = new Set(["finished", "cancelled", "failed", "rejected"]);
const SHOWN_CHUNKS = 3; // a stage's first chunks listed; the rest counted in its lane

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function ms(ns) {
  return `${(ns / 1e6).toFixed(1)} ms`;
}

function fixed(value, digits, unit) {
  return value === null || value === undefined ? "–" : `${value.toFixed(digits)}${unit}`;
}

function describe(ev) {
  switch (ev.type) {
    case "admitted":
      return `admitted (${ev.pipeline})`;
    case "routed":
      return `routed to ${ev.stage}#${ev.replica} (piece ${ev.seq}${ev.last ? ", last" : ""})`;
    case "stage_started":
      return `${ev.stage} started`;
    case "chunk":
      return `${ev.stage} ${ev.modality} chunk ${ev.index}${ev.text ? `: ${JSON.stringify(ev.text)}` : ""}`;
    case "progress":
      return `${ev.stage} step ${ev.step}/${ev.total}`;
    case "stage_finished":
      return `${ev.stage} finished (${ev.finish_reason}, ${ev.output_tokens} tokens)`;
    case "stage_failed":
      return `${ev.stage} failed: ${ev.message}`;
    case "cancel_requested":
      return `cancel requested (${ev.reason})`;
    case "cancelled":
      return `cancelled (${ev.reason})`;
    case "failed":
      return `failed (${ev.reason}) ${ev.message || ""}`;
    default:
      return ev.type.replaceAll("_", " ");
  }
}

export class Timeline {
  // `onProgress(step, total)`: a stage reported progress (a diffusion step).
  constructor(requestId, { onProgress = () => {}, onEnd = () => {} } = {}) {
    this.rid = requestId;
    this.onProgress = onProgress;
    this.onEnd = onEnd;
    this.events = [];
    this.chunksShown = new Map();
    this.node = el("section", { class: "timeline", "data-request-id": requestId });
    this.head = el("header", {}, el("code", { text: requestId }), el("span", { class: "state", text: " admitted…" }));
    this.lanes = el("div", { class: "lanes" });
    this.figures = el("div", { class: "figures" });
    this.links = el("div", { class: "links" });
    this.list = el("ol", { class: "events" });
    const details = el("details", {}, el("summary", { text: "events" }), this.list);
    this.problem = el("p", { class: "problem", role: "alert" });
    this.node.append(this.head, this.lanes, this.figures, this.links, details, this.problem);
    this.drawn = false;
    this.refusedBefore = false;
  }

  // Follows the request's events to its end.  A request not admitted yet
  // (the page named it before sending it) is asked for again.
  async follow() {
    let last = -1;
    for (let attempt = 0; attempt < 60; attempt++) {
      try {
        const query = last >= 0 ? `&last_event_id=${last}` : "";
        const resp = await call(`/v1/requests/${encodeURIComponent(this.rid)}/events?format=object${query}`);
        for await (const { data } of sse(resp)) {
          const ev = JSON.parse(data);
          last = ev.pos;
          this.add(ev);
        }
        if (this.ended) return this.finish();
      } catch (err) {
        if (err instanceof ApiError && err.status === 404 && last < 0) {
          if (this.refusedBefore) {
            this.head.querySelector(".state").textContent = " refused: not admitted, nothing in the log";
            return;
          }
          await new Promise((r) => setTimeout(r, 100));
          continue;
        }
        this.problem.textContent = `The timeline stopped: ${err.message}`;
        return;
      }
    }
  }

  // The server refused the request (4xx): where the log holds nothing of
  // it (refused before admission), the timeline stops asking and says so;
  // a refusal the log records (rejected) is shown as it is.
  refused() {
    this.refusedBefore = true;
  }

  add(ev) {
    this.events.push(ev);
    if (ev.type === "progress") this.onProgress(ev.step, ev.total);
    if (TERMINAL.has(ev.type)) this.ended = ev;
    const t0 = this.events[0].ts_ns;
    if (ev.type === "chunk") {
      const n = this.chunksShown.get(ev.stage) || 0;
      this.chunksShown.set(ev.stage, n + 1);
      if (n >= SHOWN_CHUNKS) return this.redraw();
    }
    this.list.append(
      el(
        "li",
        { "data-type": ev.type, "data-pos": String(ev.pos) },
        el("span", { class: "at", text: `+${ms(ev.ts_ns - t0)}` }),
        ` ${describe(ev)}`,
      ),
    );
    this.redraw();
  }

  redraw() {
    if (this.drawn) return;
    this.drawn = true;
    requestAnimationFrame(() => {
      this.drawn = false;
      this.draw();
    });
  }

  // The lanes: per stage, its bar from routed to its end (waiting, then
  // running), a tick per chunk it made and per piece routed to it.
  draw() {
    const evs = this.events;
    const t0 = evs[0].ts_ns;
    const span = Math.max(evs[evs.length - 1].ts_ns - t0, 1e6);
    const x = (ts) => `${(((ts - t0) / span) * 100).toFixed(2)}%`;
    const stages = new Map();
    const marks = [];
    for (const ev of evs) {
      const st = ev.stage && ev.type !== "failed" ? (stages.get(ev.stage) || { ticks: [], pieces: [], chunks: 0 }) : null;
      if (st) stages.set(ev.stage, st);
      if (ev.type === "routed" && st) {
        st.routed ??= ev.ts_ns;
        st.pieces.push(ev.ts_ns);
      } else if (ev.type === "stage_started" && st) st.started = ev.ts_ns;
      else if (ev.type === "chunk" && st) {
        st.ticks.push(ev.ts_ns);
        st.chunks += 1;
        if (ev.modality === "text" && !marks.some((m) => m.name === "first token"))
          marks.push({ name: "first token", ts: ev.ts_ns });
        if (ev.modality === "audio" && !marks.some((m) => m.name === "first audio"))
          marks.push({ name: "first audio", ts: ev.ts_ns });
      } else if ((ev.type === "stage_finished" || ev.type === "stage_failed") && st) st.end = ev.ts_ns;
      else if (TERMINAL.has(ev.type) || ev.type === "cancel_requested") marks.push({ name: ev.type.replace("_", " "), ts: ev.ts_ns });
    }
    const end = evs[evs.length - 1].ts_ns;
    const rows = [];
    for (const [name, st] of stages) {
      const bar = el("div", { class: "bar" });
      const from = st.routed ?? st.started ?? end;
      if (st.started) {
        bar.append(el("span", { class: "wait", style: `left:${x(from)};width:${x(t0 + (st.started - from))}` }));
      }
      const runFrom = st.started ?? from;
      bar.append(el("span", { class: st.end ? "run" : "run live", style: `left:${x(runFrom)};width:${x(t0 + ((st.end ?? end) - runFrom))}` }));
      for (const ts of st.pieces) bar.append(el("i", { class: "piece", style: `left:${x(ts)}` }));
      for (const ts of st.ticks) bar.append(el("i", { class: "tick", style: `left:${x(ts)}` }));
      rows.push(el("div", { class: "lane" }, el("span", { class: "name", text: `${name} · ${st.chunks} chunks` }), bar));
    }
    const axis = el("div", { class: "bar marks" });
    for (const m of marks) axis.append(el("span", { class: (m.ts - t0) / span > 0.8 ? "mark late" : "mark", style: `left:${x(m.ts)}`, title: `${m.name} +${ms(m.ts - t0)}`, text: m.name }));
    rows.push(el("div", { class: "lane" }, el("span", { class: "name", text: `0 – ${ms(span)}` }), axis));
    this.lanes.replaceChildren(...rows);
    this.head.querySelector(".state").textContent = ` ${this.ended ? this.ended.type : "running"} · ${ms(end - t0)}`;
  }

  async finish() {
    this.draw();
    this.onEnd(this.ended);
    try {
      const resp = await call(`/v1/requests/${encodeURIComponent(this.rid)}/figures`);
      this.showFigures(await resp.json());
    } catch (err) {
      this.problem.textContent = `No figures: ${err.message}`;
    }
    this.showLinks();
  }

  showFigures(f) {
    const kpi = (name, value, key) => el("div", { class: "kpi", "data-figure": key }, el("b", { text: value }), el("span", { text: name }));
    const row = el(
      "div",
      { class: "kpis" },
      kpi("TTFT", fixed(f.ttft_ms, 1, " ms"), "ttft"),
      kpi("first audio", fixed(f.time_to_first_audio_ms, 1, " ms"), "first_audio"),
      kpi("end to end", fixed(f.e2e_ms, 1, " ms"), "e2e"),
      kpi("RTF", fixed(f.rtf, 2, ""), "rtf"),
    );
    if (f.time_to_first_image_ms !== null) row.append(kpi("first image", fixed(f.time_to_first_image_ms, 1, " ms"), "first_image"));
    const table = el("table", {}, el("tr", {}, ...["stage", "queue", "first chunk", "run", "tokens", "tokens/s"].map((h) => el("th", { text: h }))));
    for (const s of f.stages) {
      table.append(
        el(
          "tr",
          { "data-stage": s.name },
          ...[s.name, fixed(s.queue_ms, 1, " ms"), fixed(s.first_chunk_ms, 1, " ms"), fixed(s.run_ms, 1, " ms"), String(s.output_tokens), fixed(s.tokens_per_s, 1, "")].map((t) => el("td", { text: t })),
        ),
      );
    }
    this.figures.replaceChildren(row, table);
  }

  // The trace and its HTML view are fetched with the key, then offered as
  // files of this page (a plain link could not send the key).
  showLinks() {
    const rid = encodeURIComponent(this.rid);
    const trace = el("button", { type: "button", class: "trace", text: "Download trace" });
    trace.addEventListener("click", () => this.open(`/v1/requests/${rid}/trace`, `${this.rid}.omnixtrace`));
    const view = el("button", { type: "button", class: "replay", text: "Replay view" });
    view.addEventListener("click", () => this.open(`/v1/requests/${rid}/trace.html`, null));
    this.links.replaceChildren(trace, " ", view, el("span", { class: "hint", text: ` omnix replay ${this.rid}.omnixtrace` }));
  }

  async open(path, filename) {
    try {
      const blob = await (await call(path)).blob();
      const a = el("a", { href: URL.createObjectURL(blob) });
      if (filename) a.download = filename;
      else a.target = "_blank";
      document.body.append(a);
      a.click();
      a.remove();
    } catch (err) {
      this.problem.textContent = err.message;
    }
  }
}
