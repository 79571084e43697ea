// Talking with the model over /v1/realtime: the session's socket, the
// microphone (server VAD finds the turns), typed turns, the answer's audio
// played as it arrives and stopped when the person speaks over it.  What it
// shows goes through `ui` (main.js); it keeps only what the page needs to
// play and show, never a copy of the conversation the log holds.

import { apiKey } from "./api.js";

const RATE = 24000; // the Realtime API's PCM: 16-bit, 24 kHz, mono
const SEND_SAMPLES = 2400; // 100 ms per input_audio_buffer.append

function toBase64(int16) {
  const bytes = new Uint8Array(int16.buffer, int16.byteOffset, int16.byteLength);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function fromBase64(b64) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  return new Int16Array(bytes.buffer, 0, bytes.length >> 1);
}

// The answer's audio: each delta scheduled right after the one before.
export class Player {
  constructor() {
    this.ctx = new AudioContext({ sampleRate: RATE });
    this.next = 0;
    this.sources = new Set();
    this.samples = 0; // how many samples were given to the audio output
  }

  play(b64) {
    const pcm = fromBase64(b64);
    if (!pcm.length) return;
    const buf = this.ctx.createBuffer(1, pcm.length, RATE);
    const ch = buf.getChannelData(0);
    for (let i = 0; i < pcm.length; i++) ch[i] = pcm[i] / 32768;
    const src = this.ctx.createBufferSource();
    src.buffer = buf;
    src.connect(this.ctx.destination);
    const at = Math.max(this.ctx.currentTime + 0.05, this.next);
    src.start(at);
    this.next = at + buf.duration;
    this.samples += pcm.length;
    this.sources.add(src);
    src.onended = () => this.sources.delete(src);
  }

  // Barge-in: what was scheduled and not heard yet is dropped.
  stop() {
    for (const src of this.sources) src.stop();
    this.sources.clear();
    this.next = 0;
  }
}

export class Talk {
  constructor(model, ui) {
    this.model = model;
    this.ui = ui;
    this.player = new Player();
    this.listening = false;
    this.closing = false;
    this.pending = [];
  }

  connect() {
    const url = new URL(`/v1/realtime?model=${encodeURIComponent(this.model)}`, location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    // A browser's WebSocket sends no headers: the key goes as a subprotocol.
    const key = apiKey();
    this.ws = key ? new WebSocket(url, ["realtime", `openai-insecure-api-key.${key}`]) : new WebSocket(url);
    this.ws.onmessage = (m) => this.handle(JSON.parse(m.data));
    this.ws.onopen = () => {
      for (const msg of this.pending) this.ws.send(msg);
      this.pending = [];
    };
    this.ws.onclose = (e) => {
      if (this.closing) return;
      this.stopMic();
      this.ui.problem(
        e.code === 1006 && !this.opened
          ? "The realtime session was refused (a wrong API key, or the server is gone). Check the key, then reload."
          : `The server closed the session (code ${e.code}): it may have stopped. Start it again, then reload this page.`,
      );
    };
  }

  send(event) {
    const msg = JSON.stringify(event);
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(msg);
    else this.pending.push(msg);
  }

  handle(ev) {
    switch (ev.type) {
      case "session.created": {
        this.opened = true;
        const hears = Boolean(ev.session.audio?.input?.turn_detection);
        if (hears) {
          // The person's words as text too (a request of its own per turn).
          this.send({ type: "session.update", session: { type: "realtime", audio: { input: { transcription: { model: this.model } } } } });
        }
        this.ui.ready(hears);
        break;
      }
      case "input_audio_buffer.speech_started":
        this.player.stop();
        this.ui.userTurn(ev.item_id, "…");
        break;
      case "conversation.item.input_audio_transcription.delta":
        this.ui.userText(ev.item_id, ev.delta, true);
        break;
      case "conversation.item.input_audio_transcription.completed":
        this.ui.userText(ev.item_id, ev.transcript, false);
        break;
      case "conversation.item.input_audio_transcription.failed":
        this.ui.userText(ev.item_id, `(not transcribed: ${ev.error?.message || "failed"})`, false);
        break;
      case "response.created":
        this.ui.answerTurn(ev.response.id);
        break;
      case "response.output_audio_transcript.delta":
      case "response.output_text.delta":
        this.ui.answerText(ev.response_id, ev.delta);
        break;
      case "response.output_audio.delta":
        this.player.play(ev.delta);
        this.ui.answerAudio(ev.response_id, this.player.samples);
        break;
      case "response.done":
        this.ui.answerDone(ev.response.id, ev.response.status, ev.response.status_details);
        break;
      case "error":
        this.ui.problem(ev.error.message);
        break;
      default:
        break;
    }
  }

  // The voice of the answers from now on (one of GET /v1/audio/voices).
  voice(name) {
    this.send({ type: "session.update", session: { type: "realtime", audio: { output: { voice: name } } } });
  }

  say(text) {
    const id = `item_pg${Date.now().toString(36)}`;
    this.ui.userTurn(id, text);
    this.send({ type: "conversation.item.create", item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
    this.send({ type: "response.create" });
  }

  async startMic() {
    await this.player.ctx.resume();
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
    } catch (err) {
      const why =
        err.name === "NotAllowedError"
          ? "The microphone is not allowed for this page: allow it in the browser's site settings, then reload (or type below)."
          : `No microphone could be opened (${err.name}): plug one in, then reload (or type below).`;
      this.ui.problem(why);
      return false;
    }
    this.stream = stream;
    const ctx = this.player.ctx;
    await ctx.audioWorklet.addModule("/playground/capture.js");
    this.source = ctx.createMediaStreamSource(stream);
    this.capture = new AudioWorkletNode(ctx, "omnix-capture");
    let buf = new Int16Array(SEND_SAMPLES);
    let n = 0;
    this.capture.port.onmessage = ({ data }) => {
      for (let i = 0; i < data.length; i++) {
        const v = Math.max(-1, Math.min(1, data[i]));
        buf[n++] = v < 0 ? v * 32768 : v * 32767;
        if (n === SEND_SAMPLES) {
          this.send({ type: "input_audio_buffer.append", audio: toBase64(buf) });
          buf = new Int16Array(SEND_SAMPLES);
          n = 0;
        }
      }
    };
    this.source.connect(this.capture);
    this.listening = true;
    return true;
  }

  stopMic() {
    if (!this.listening) return;
    this.listening = false;
    this.source.disconnect();
    this.capture.disconnect();
    for (const t of this.stream.getTracks()) t.stop();
  }
}
