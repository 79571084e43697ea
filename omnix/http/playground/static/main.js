// The page: asks the server what it serves (GET /v1/models), offers what
// that pipeline does (talk.js for a pipeline that listens and speaks,
// forms.js for the rest, with speech.js's fields where the card lists
// them), lays out each turn beside its request's timeline (timeline.js),
// and says every failure in words.

import { ApiError, GONE, apiKey, call, setApiKey } from "./api.js";
import * as forms from "./forms.js";
import { speechFields } from "./speech.js";
import { Talk } from "./talk.js";
import { Timeline } from "./timeline.js";

const $ = (id) => document.getElementById(id);

function turn(cls, attrs, text) {
  const li = document.createElement("li");
  li.className = `turn ${cls}`;
  for (const [k, v] of Object.entries(attrs)) li.dataset[k] = v;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  li.append(body);
  $("turns").append(li);
  li.scrollIntoView({ block: "end" });
  return li;
}

const answers = new Map();
const users = new Map();
// The field a refusal names (its `param`) -> the page's control for it.
const CONTROLS = { input: "text", voice: "voice", instructions: "instructions", language: "language", ref_audio: "ref-audio", ref_text: "ref-text" };

const ui = {
  // `param`: the request field the problem is about, marked on its control.
  problem(message, param = "") {
    $("problem").textContent = message;
    $("problem").hidden = !message;
    for (const node of document.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
    const control = CONTROLS[param] && $(CONTROLS[param]);
    if (control) control.setAttribute("aria-invalid", "true");
  },
  ready(hears) {
    $("mic").hidden = !hears;
    $("mic-state").textContent = hears ? "press Talk, speak, pause: the answer plays; speak over it to interrupt" : "";
  },
  userTurn(id, text) {
    users.set(id, turn("user", { item: id }, text));
  },
  userText(id, text, append) {
    const li = users.get(id) || (users.set(id, turn("user", { item: id }, "")), users.get(id));
    const body = li.querySelector(".text");
    body.textContent = append && body.textContent !== "…" ? body.textContent + text : text;
  },
  answerTurn(rid) {
    if (answers.has(rid)) return answers.get(rid);
    const li = turn("answer", { requestId: rid, status: "running" }, "");
    const timeline = new Timeline(rid, { onProgress: (step, total) => ui.answerProgress(rid, step, total) });
    li.append(timeline.node);
    li.timeline = timeline;
    answers.set(rid, li);
    timeline.follow();
    return li;
  },
  answerText(rid, delta) {
    ui.answerTurn(rid).querySelector(".text").textContent += delta;
  },
  answerAudio(rid, samples) {
    const li = ui.answerTurn(rid);
    li.dataset.audioSamples = String(samples);
    li.classList.add("speaking");
  },
  answerMedia(rid, kind, url) {
    const node = document.createElement(kind);
    node.src = url;
    if (kind !== "img") node.controls = true;
    if (kind === "audio") node.autoplay = true;
    ui.answerTurn(rid).querySelector(".text").append(node);
  },
  answerProgress(rid, step, total) {
    const li = ui.answerTurn(rid);
    let bar = li.querySelector("progress");
    if (!bar) {
      bar = document.createElement("progress");
      li.querySelector(".text").append(bar);
    }
    bar.max = total;
    bar.value = step;
  },
  // Refused before admission (`message`: why): no events to follow.
  answerRefused(rid, message) {
    const li = ui.answerTurn(rid);
    li.dataset.status = "refused";
    li.querySelector(".text").textContent = `Refused: ${message}`;
    li.timeline.refused();
  },
  answerDone(rid, status, details) {
    const li = ui.answerTurn(rid);
    li.dataset.status = status;
    li.classList.remove("speaking");
    if (status === "cancelled" && details?.reason === "turn_detected") li.classList.add("interrupted");
  },
};

function showKeyForm() {
  $("key").hidden = false;
  $("key-input").value = "";
  $("key-input").focus();
}

// A server still loading its models answers 503 to work: wait for /ready.
async function ready() {
  for (;;) {
    let body;
    try {
      body = await (await fetch("/ready")).json();
    } catch {
      throw new ApiError(0, "unreachable", GONE);
    }
    if (body.ready) return;
    const stages = Object.entries(body.stages || {}).map(([s, n]) => `${s} ${n ? "ready" : "loading"}`);
    ui.problem(`The server is loading its models (${stages.join(", ")}): the page goes on once it is ready.`);
    await new Promise((r) => setTimeout(r, 1000));
  }
}

async function boot() {
  let card;
  try {
    await ready();
    card = (await (await call("/v1/models")).json()).data[0];
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) showKeyForm();
    ui.problem(err.message);
    return;
  }
  ui.problem("");
  $("key").hidden = true;
  const variant = card.speech?.task_type ? ` · Qwen3-TTS ${card.speech.task_type}` : "";
  $("model").textContent = `${card.id}: ${card.stages.join(" → ")} (${card.modalities.join(", ")})${variant}`;
  $("controls").hidden = false;
  const out = new Set(card.modalities);
  const select = $("voice");
  if (out.has("audio")) {
    for (const v of await forms.voices()) select.append(new Option(v, v));
    select.hidden = select.options.length === 0;
  }
  let send;
  if (out.has("audio") && out.has("text")) {
    const talk = new Talk(card.id, ui);
    talk.connect();
    select.addEventListener("change", () => talk.voice(select.value));
    $("mic").addEventListener("click", async () => {
      if (talk.listening) {
        talk.stopMic();
        $("mic").classList.remove("on");
        return;
      }
      if (await talk.startMic()) $("mic").classList.add("on");
    });
    send = async (text) => {
      await talk.player.ctx.resume();
      talk.say(text);
    };
  } else if (out.has("text")) {
    const messages = [];
    send = async (text) => {
      messages.push({ role: "user", content: text });
      turn("user", {}, text);
      const { text: answer } = await forms.chat(card.id, messages, ui);
      messages.push({ role: "assistant", content: answer });
    };
  } else if (out.has("audio")) {
    $("text").placeholder = "Text to speak…";
    const read = speechFields(card.speech);
    send = async (text) => {
      let asked;
      try {
        asked = await read();
      } catch (err) {
        ui.problem(err.message, "ref_audio");
        return;
      }
      const voice = select.value || "default";
      const said = [select.options.length ? `voice: ${voice}` : "", asked.said].filter(Boolean).join(" · ");
      const li = turn("user", {}, text);
      if (said) li.querySelector(".text").append(Object.assign(document.createElement("small"), { className: "asked", textContent: said }));
      await forms.speech(card.id, text, voice, asked.fields, ui);
    };
  } else {
    const kind = out.has("image") ? "image" : "video";
    $("text").placeholder = `Describe the ${kind}…`;
    send = async (text) => {
      turn("user", {}, text);
      await forms[kind](card.id, text, ui);
    };
  }
  $("say").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("text").value.trim();
    if (!text) return;
    $("text").value = "";
    ui.problem("");
    send(text);
  });
}

$("key").addEventListener("submit", (e) => {
  e.preventDefault();
  setApiKey($("key-input").value.trim());
  location.reload();
});
if (apiKey()) $("key").dataset.given = "1";
boot();
