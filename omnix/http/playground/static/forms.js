// What the page offers a pipeline that does not talk: chat text streamed,
// speech from text (the server's voices), images, video jobs.  Each call
// names its request (X-Request-Id) so that main.js follows its timeline
// from the first event, and says its failure in words through `ui`.

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
    ui.answerDone(rid, "failed");
    ui.problem(err.message);
  }
  return { turn, text };
}

export async function speech(model, input, voice, ui) {
  const rid = newRequestId("speech");
  ui.answerTurn(rid);
  try {
    const resp = await call("/v1/audio/speech", {
      method: "POST",
      json: { model, input, voice, response_format: "wav" },
      extraHeaders: { "X-Request-Id": rid },
    });
    ui.answerMedia(rid, "audio", URL.createObjectURL(await resp.blob()));
    ui.answerDone(rid, "completed");
  } catch (err) {
    ui.answerDone(rid, "failed");
    ui.problem(err.message);
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
    ui.answerDone(rid, "failed");
    ui.problem(err.message);
  }
}

// A video job: created, polled for its progress, then played.
export async function video(model, prompt, ui) {
  const form = new FormData();
  form.append("model", model);
  form.append("prompt", prompt);
  try {
    let job = await (await call("/v1/videos", { method: "POST", form })).json();
    const rid = job.request_ids[0];
    ui.answerTurn(rid);
    while (job.status === "queued" || job.status === "in_progress") {
      ui.answerProgress(rid, job.progress, 100);
      await new Promise((r) => setTimeout(r, 500));
      job = await (await call(`/v1/videos/${job.id}`)).json();
    }
    if (job.status !== "completed") throw new Error(job.error?.message || `the video job ${job.status}`);
    const blob = await (await call(`/v1/videos/${job.id}/content`)).blob();
    ui.answerMedia(rid, "video", URL.createObjectURL(blob));
    ui.answerDone(rid, "completed");
  } catch (err) {
    ui.problem(err.message);
  }
}
