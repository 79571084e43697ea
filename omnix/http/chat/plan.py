"""A chat completion body -> the requests it submits.

Owns: the mapping of a ``ChatCompletionRequest`` onto ``RequestSpec``s:
its conversations (one, or a batch: one request each, ``ID-0``, ``ID-1``...),
their messages with the decoded media parts in place (``media_parts``
lists what the HTTP layer decodes first), the output modalities, ``n``
samples of one prompt (a group, seeds ``seed``, ``seed+1``...), the
standard sampling parameters and the tools (``tools.py``) put on the text
stage, audio output on the
speech stages, and the ``ChatOptions`` the response renders from.
Everything it can judge without the pipeline's own validation is a 400
here, before anything is admitted.

Does not own media decoding (``omnix.http.media``), admission
(``core.submit``) nor the response's bytes (``render.py``).
"""

from __future__ import annotations

import msgspec

from omnix.events.options import API_CHAT, AudioFormat, ChatOptions
from omnix.events.types import ChatMessage, MediaPart, Modality, RequestSpec, StageParams
from omnix.http.chat.protocol import ChatCompletionRequest
from omnix.http.chat.tools import history_calls, tool_params
from omnix.http.common.fields import MediaContentPart, Message, TextPart
from omnix.http.common.plan import DecodedBlob, Media, Plan, PlanContext, group_ids, member
from omnix.http.common.rendering import RENDER_VERSION
from omnix.http.common.sampling import bad, put, sampling_extras, text_params
from omnix.http.core.errors import ApiError
from omnix.http.media.decoder import TRACK

#: Roles whose message must have content (OpenAI refuses ``content: null``
#: on them; an assistant message may be null, having made tool calls).
CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})


def _conversations(body: ChatCompletionRequest) -> list[tuple[str, list[Message]]]:
    """The body's conversations with the JSON path of each: one
    (``messages``) or a batch (``messages[i]``)."""
    if any(isinstance(m, list) for m in body.messages):
        return [(f"messages[{i}]", c) for i, c in enumerate(body.messages) if isinstance(c, list)]
    return [("messages", [m for m in body.messages if not isinstance(m, list)])]


def media_parts(body: ChatCompletionRequest) -> list[tuple[str, MediaContentPart]]:
    """Every audio, image and video part of a chat body, in order, with its
    JSON path: what the HTTP layer decodes before planning."""
    out: list[tuple[str, MediaContentPart]] = []
    for where, conv in _conversations(body):
        for i, m in enumerate(conv):
            if isinstance(m.content, list):
                for j, part in enumerate(m.content):
                    if not isinstance(part, TextPart):
                        out.append((f"{where}[{i}].content[{j}]", part))
    return out


def _messages(conv: list[Message], where: str, media: Media) -> tuple[ChatMessage, ...]:
    if not conv:
        raise bad(where, f"{where} is empty: give at least one message.")
    out = []
    for i, m in enumerate(conv):
        c = m.content
        parts: list[MediaPart] = []
        if c is None:
            text = ""
        elif isinstance(c, str):
            text = c
        else:
            texts: list[str] = []
            at = 0  # length of "\n".join(texts) so far
            for j, part in enumerate(c):
                if isinstance(part, TextPart):
                    at += len(part.text) + (1 if texts else 0)
                    texts.append(part.text)
                    continue
                param = f"{where}[{i}].content[{j}]"
                decoded = media.get(param)
                if decoded is None:  # the HTTP layer decodes every part first
                    raise ApiError(500, f"{param} was not decoded", param=param)
                if m.role != "user":
                    raise bad(param, f"{param}: only user messages may carry audio or images.")
                parts.append(msgspec.structs.replace(decoded, at=at))
                track = media.get(param + TRACK)  # a video's sound track, heard with it
                if track is not None:
                    parts.append(msgspec.structs.replace(track, at=at))
            text = "\n".join(texts)
        calls, answers = history_calls(m)
        out.append(
            ChatMessage(
                role=m.role,
                content=text,
                media=tuple(parts),
                tool_calls=calls,
                tool_call_id=answers,
            )
        )
    _check_tracks(out, where)
    return tuple(out)


def _check_tracks(messages: list[ChatMessage], where: str) -> None:
    """A video heard with its sound track leaves no room for other audio:
    vLLM's Qwen3-Omni then takes every audio item of the prompt as a
    video's track (``use_audio_in_video`` holds for the whole prompt)."""
    parts = [p for m in messages for p in m.media]
    if any(p.in_video for p in parts) and any(p.kind == "audio" and not p.in_video for p in parts):
        raise ApiError(
            400,
            f"{where}: a video with a sound track and an audio part in one request: the model "
            "hears a video's sound with it, and then takes no other audio. Send the audio in "
            "another request, or a video without sound.",
            param=where,
            code="unsupported_input",
        )


def _check_contents(convs: list[list[Message]], batched: bool) -> None:
    for k, conv in enumerate(convs):
        where = f"messages[{k}]" if batched else "messages"
        for i, m in enumerate(conv):
            if m.content is None and m.role in CONTENT_REQUIRED:
                raise bad(
                    f"{where}[{i}].content",
                    f"{where}[{i}].content is null: a {m.role} message needs content, "
                    "a string or a list of content parts.",
                )


def _conversations_of(
    body: ChatCompletionRequest, media: Media
) -> tuple[list[tuple[ChatMessage, ...]], bool]:
    """The conversations to submit (one, or a batch's), and whether a batch."""
    if not body.messages:
        raise bad("messages", "messages is empty: give at least one message.")
    batch = [m for m in body.messages if isinstance(m, list)]
    single = [m for m in body.messages if not isinstance(m, list)]
    if batch and single:
        raise bad(
            "messages",
            "messages mixes messages and lists of messages: send one conversation "
            "(a list of messages) or a batch (a list of conversations).",
        )
    batched = bool(batch)
    _check_contents(batch if batched else [single], batched)
    convs = (
        [_messages(c, f"messages[{i}]", media) for i, c in enumerate(batch)]
        if batched
        else [_messages(single, "messages", media)]
    )
    if batched and body.stream:
        raise ApiError(
            400,
            "a batch of conversations cannot be streamed: send stream=false, or one "
            "conversation per request to stream.",
            param="stream",
            code="unsupported_value",
        )
    return convs, batched


def _modalities(body: ChatCompletionRequest) -> tuple[Modality, ...]:
    modalities = tuple(body.modalities) if body.modalities is not None else ("text",)
    if not modalities:
        raise bad("modalities", 'modalities is empty: give ["text"] or ["text", "audio"].')
    if len(set(modalities)) != len(modalities):
        raise bad("modalities", "each modality may be listed once.")
    if body.audio is not None and "audio" not in modalities:
        raise bad(
            "audio", 'audio output parameters were given but modalities does not include "audio".'
        )
    return modalities


def _sampling(body: ChatCompletionRequest) -> StageParams:
    """The top-level sampling fields, for the text stage."""
    if body.top_logprobs is not None and not body.logprobs:
        raise bad("top_logprobs", "top_logprobs needs logprobs: true.")
    return sampling_extras(
        body,
        temperature=body.temperature,
        top_p=body.top_p,
        stop=body.stop,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
    )


def _check_samples(body: ChatCompletionRequest, batched: bool, wants_audio: bool) -> None:
    """``n`` > 1: one conversation, not streamed with audio, not resumable."""
    n = body.n
    if n <= 1:
        return
    if batched:
        raise ApiError(
            400,
            f"n={n} with a batch of conversations is not supported: send n=1 with a batch, "
            "or one conversation with n > 1.",
            param="n",
            code="unsupported_value",
        )
    if body.stream and wants_audio:
        raise ApiError(
            400,
            f"n={n} cannot be streamed with audio output: send stream=false, or n=1, or "
            'modalities ["text"].',
            param="n",
            code="unsupported_value",
        )
    if body.stream_options is not None and body.stream_options.resumable:
        raise ApiError(
            400,
            f"a stream of n={n} choices is not resumable: send n=1 to get a resumable "
            "stream, or omit stream_options.resumable.",
            param="stream_options",
            code="unsupported_value",
        )


def _options(
    body: ChatCompletionRequest,
    served: PlanContext,
    outputs: tuple[Modality, ...],
    text_stage: str,
    logprobs: bool,
) -> ChatOptions:
    """How the response renders (its group, per member, comes later)."""
    opts = ChatOptions(
        render=RENDER_VERSION,
        stream=body.stream and body.n == 1,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        usage_stage=text_stage,
        text_stage=served.output_stage("text") if "text" in outputs else "",
        resumable=bool(body.stream_options and body.stream_options.resumable),
        logprobs=logprobs,
    )
    if "audio" not in outputs:
        return opts
    audio = body.audio
    fmt = audio.format if audio is not None else ("pcm16" if body.stream else "wav")
    audio_format: AudioFormat = "pcm" if fmt == "pcm16" else fmt
    return msgspec.structs.replace(
        opts,
        audio_stage=served.output_stage("audio"),
        audio_format=audio_format,
        voice=audio.voice if audio is not None else "default",
        sample_rate=served.sample_rate(),
    )


def chat_plan(
    body: ChatCompletionRequest,
    served: PlanContext,
    *,
    traceparent: str = "",
    media: Media | None = None,
    blobs: tuple[DecodedBlob, ...] = (),
) -> Plan:
    """``media``: the body's decoded media parts (``media_parts``), keyed
    by their JSON path; ``blobs``: their arrays, to store on admission."""
    served.check_model(body.model)
    if body.stream_options is not None and not body.stream:
        raise bad("stream_options", "stream_options is only allowed when stream is true.")
    convs, batched = _conversations_of(body, media or {})
    outputs = _modalities(body)
    base = _sampling(body)
    _check_samples(body, batched, "audio" in outputs)
    if base.logprobs is not None and "text" not in outputs:
        raise bad("logprobs", 'logprobs are of the text answer: modalities must include "text".')
    text_stage = served.output_stage("text") or served.source_stage(outputs)
    params = text_params(served, body.sampling_params_list, text_stage, base)
    for st, given in params.items():
        if given.tools is not None or given.tool_choice is not None:
            raise bad(
                "sampling_params_list",
                f"sampling_params_list[{st!r}] gives tools: give them in the body's tools "
                "and tool_choice.",
            )
    put(params, text_stage, tool_params(body, served, text_stage))
    opts = _options(body, served, outputs, text_stage, base.logprobs is not None)
    if "audio" in outputs:
        served.check_voice(opts.voice, "audio.voice")
        for st in served.media_stages(outputs, "audio"):
            put(params, st, StageParams(voice=opts.voice))
    seed = served.seed(body.seed)
    n = body.n
    convs = convs * n if n > 1 else convs
    gid, rids = group_ids(served, len(convs))
    specs = tuple(
        (
            rid,
            RequestSpec(
                messages=conv,
                outputs=outputs,
                stage_params=params,
                seed=(seed + i) % 2**63,
                api=API_CHAT,
                model=served.model_for(body.model),
                traceparent=traceparent,
                response=msgspec.structs.replace(
                    opts,
                    group=member(gid, i, len(convs), samples=n > 1, streamed=n > 1 and body.stream),
                ),
            ),
        )
        for i, (rid, conv) in enumerate(zip(rids, convs, strict=True))
    )
    return Plan(specs=specs, stream=body.stream, blobs=blobs)
