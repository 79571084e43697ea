// What the page offers a pipeline that does not talk: chat text streamed,
// speech from text (the server's voices, and the fields the model card
// says the speech route takes: a Qwen3-TTS checkpoint's instructions,
// language, voice to clone), images, video jobs.  Each call names its
// request (X-Request-Id) so that main.js follows its timeline from the
// first event, and says its failure in words through `ui`.

import { ApiError, DROPPED, call, newRequestId, sse } from "./api.js";

export async function voices() {
  try {
    return (await (await call("/v1/audio/voices")).json()).voices || [];
  } catch {
    return [];
  }
}

// A chat turn streamed: `messages` the conversation so far (the page's own
// record of what it sent and was answered).
export async function chat(model, messages, ui) {
  const rid = newRequestId("chat");
  const turn = ui.answerTurn(rid);
  let text = "";
  try {
    const resp = await call("/v1/chat/completions", {
      method: "POST",
      json: { model, messages, stream: true },
      extraHeaders: { "X-Request-Id": rid },
    });
    let done = false;
    for await (const { data } of sse(resp)) {
      if (data === "[DONE]") {
        done = true;
        break;
      }
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices?.[0]?.delta?.content || "";
      if (delta) {
        text += delta;
        ui.answerText(rid, delta);
      }
    }
    // A stream cut short (the server stopped) ends without its [DONE].
    if (!done) throw new ApiError(0, "dropped", DROPPED);
    ui.answerDone(rid, "completed");
  } catch (err) {
    failed(rid, err, ui);
  }
  return { turn, text };
}

// A refusal (4xx: checked before admission, nothing in the log) or a
// failure, said in words; a refusal names the field it is about.
function failed(rid, err, ui) {
  if (err instanceof ApiError && err.status >= 400 && err.status < 500) ui.answerRefused(rid, err.message);
  else ui.answerDone(rid, "failed");
  ui.problem(err.message, err.param);
}

// `fields`: the speech route's fields beyond the voice that the person
// gave (instructions, language, ref_audio, ref_text), as the body takes them.
export async function speech(model, input, voice, fields, ui) {
  const rid = newRequestId("speech");
  ui.answerTurn(rid);
  try {
    const resp = await call("/v1/audio/speech", {
      method: "POST",
      json: { model, input, voice, response_format: "wav", ...fields },
      extraHeaders: { "X-Request-Id": rid },
    });
    ui.answerMedia(rid, "audio", URL.createObjectURL(await resp.blob()));
    ui.answerDone(rid, "completed");
  } catch (err) {
    failed(rid, err, ui);
  }
}

export async function image(model, prompt, ui) {
  const rid = newRequestId("image");
  ui.answerTurn(rid);
  try {
    const resp = await call("/v1/images/generations", {
      method: "POST",
      json: { model, prompt, n: 1 },
      extraHeaders: { "X-Request-Id": rid },
    });
    const body = await resp.json();
    ui.answerMedia(rid, "img", `data:image/png;base64,${body.data[0].b64_json}`);
    ui.answerDone(rid, "completed");
  } catch (err) {
    failed(rid, err, ui);
  }
}

// A video job: created, polled until it ends, then played.  Its progress
// bar is its denoising steps as the log records them (the timeline's, as
// an image's): the job's own percentage, polled, would race them.
export async function video(model, prompt, ui) {
  const form = new FormData();
  form.append("model", model);
  form.append("prompt", prompt);
  let rid = "";
  try {
    let job = await (await call("/v1/videos", { method: "POST", form })).json();
    rid = job.request_ids[0];
    ui.answerTurn(rid);
    while (job.status === "queued" || job.status === "in_progress") {
      await new Promise((r) => setTimeout(r, 500));
      job = await (await call(`/v1/videos/${encodeURIComponent(job.id)}`)).json();
    }
    if (job.status !== "completed") throw new Error(`The video job failed: ${job.error?.message || job.status}`);
    const blob = await (await call(`/v1/videos/${encodeURIComponent(job.id)}/content`)).blob();
    ui.answerMedia(rid, "video", URL.createObjectURL(blob));
    ui.answerDone(rid, "completed");
  } catch (err) {
    if (rid) ui.answerDone(rid, "failed");
    ui.problem(err.message, err.param);
  }
}
