// The page's one way to call the server: the API key it holds for this tab,
// each call's failure said in words, and an SSE stream read over fetch
// (EventSource cannot send the key).  Owns no state of the server's.

const KEY_ITEM = "omnix.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_ITEM, key);
  else sessionStorage.removeItem(KEY_ITEM);
}

export class ApiError extends Error {
  // `param`: the request field a 400 names ("" when none).
  constructor(status, code, message, param = "") {
    super(message);
    this.status = status;
    this.code = code;
    this.param = param;
  }
}

export const GONE =
  "The server cannot be reached: it may have stopped. Start it again (omnix serve), then reload this page.";
export const DROPPED =
  "The server went away in the middle of the answer: it may have stopped. Start it again (omnix serve), then reload this page.";

// What a refusal means to the person at the page.
export function say(status, error) {
  const message = (error && error.message) || "";
  const code = (error && error.code) || "";
  if (status === 401 && code === "invalid_api_key")
    return "The API key was refused: it is not the key this server was started with (omnix serve --api-key). Enter it again.";
  if (status === 401)
    return "This server needs an API key (it was started with --api-key): enter it above.";
  if (status === 403)
    return `The server refused this page's origin: ${message}`;
  if (status === 503)
    return `The server is not ready (${message || "loading or stopping"}). Wait, then reload.`;
  return message || `The server answered ${status}.`;
}

export function headers(extra = {}) {
  const out = { ...extra };
  const key = apiKey();
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

async function errorOf(resp) {
  let error = {};
  try {
    error = (await resp.json()).error || {};
  } catch {
    // not OpenAI's error body: the status says enough
  }
  return new ApiError(resp.status, error.code || "", say(resp.status, error), error.param || "");
}

// fetch with the key; a refusal or an unreachable server as an ApiError.
export async function call(path, { method = "GET", json, form, extraHeaders = {}, signal } = {}) {
  const hdrs = headers(extraHeaders);
  let body;
  if (json !== undefined) {
    hdrs["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  } else if (form !== undefined) {
    body = form;
  }
  let resp;
  try {
    resp = await fetch(path, { method, headers: hdrs, body, signal });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "unreachable", GONE);
  }
  if (!resp.ok) throw await errorOf(resp);
  return resp;
}

// The events of an SSE response, as {id, event, data}; a stream the server
// drops before its end throws an ApiError saying so.
export async function* sse(resp) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch {
      throw new ApiError(0, "dropped", DROPPED);
    }
    if (chunk.done) break;
    buffer += chunk.value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const ev = { id: "", event: "message", data: "" };
      for (const line of block.split("\n")) {
        const colon = line.indexOf(":");
        if (colon <= 0) continue;
        const field = line.slice(0, colon);
        const value = line.slice(colon + 1).replace(/^ /, "");
        if (field === "data") ev.data += (ev.data ? "\n" : "") + value;
        else if (field === "id" || field === "event") ev[field] = value;
      }
      if (ev.data) yield ev;
    }
  }
}

// A request id the page names its request by (X-Request-Id), so that it can
// follow the request's events while the response is still on its way.
export function newRequestId(kind) {
  const bytes = crypto.getRandomValues(new Uint8Array(8));
  return `pg-${kind}-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}
