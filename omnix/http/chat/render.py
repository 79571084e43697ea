"""Chat completions' bytes, as a pure function of the request's events.

Owns: the whole ``chat.completion`` of one request or of a batch's members
(``whole``: one choice per member, ``message.audio`` when asked for, the
tool calls and reasoning a stage's parsers split off), the
``chat.completion.chunk`` SSE stream (``ChatStream``: a role chunk at
admission, content, reasoning, tool-call and audio deltas as chunks arrive,
a finish chunk, an
optional usage chunk, ``[DONE]``; a request that fails or is cancelled
mid-stream ends with an ``{"error": ...}`` event and ``[DONE]``), and which
of its SSE events carry ``id:`` (``stream_ids``).

Does not own the dispatch over APIs nor the entry points
(``omnix.http.render``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from msgspec import UNSET

from omnix.events.options import ChatOptions
from omnix.events.types import Admitted, Chunk, Finished, TokenLogprob, ToolCallDelta
from omnix.http.chat.protocol import (
    AssistantMessage,
    AudioOut,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    FunctionCallOut,
    FunctionDeltaOut,
    TokenLogprobOut,
    ToolCallDeltaOut,
    ToolCallOut,
    TopLogprob,
)
from omnix.http.common.audio import StreamEncoder, encode_audio
from omnix.http.common.fields import Usage
from omnix.http.common.rendering import (
    AUDIO_EXPIRES_S,
    Rendered,
    StreamTail,
    b64,
    encode,
    group_id,
    json_head,
    sse,
    totals,
)
from omnix.http.common.summary import RequestSummary


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def choice_logprobs(lps: Iterable[TokenLogprob]) -> ChoiceLogprobs:
    """OpenAI's ``choices[].logprobs`` for recorded per-token logprobs."""
    return ChoiceLogprobs(
        content=[
            TokenLogprobOut(
                token=lp.token,
                logprob=lp.logprob,
                bytes=_token_bytes(lp.token),
                top_logprobs=[
                    TopLogprob(token=t, logprob=v, bytes=_token_bytes(t)) for t, v in lp.top
                ],
            )
            for lp in lps
        ]
    )


def tool_calls(pieces: Iterable[ToolCallDelta]) -> list[ToolCallOut]:
    """The calls a parser's pieces make, whole, in the order they began."""
    calls: dict[int, ToolCallOut] = {}
    for p in pieces:
        call = calls.get(p.index)
        if call is None:
            calls[p.index] = ToolCallOut(
                id=p.id, function=FunctionCallOut(name=p.name, arguments=p.arguments)
            )
            continue
        f = call.function
        f.name = f.name or p.name
        f.arguments += p.arguments
        call.id = call.id or p.id
    return list(calls.values())


def _delta_calls(pieces: Iterable[ToolCallDelta]) -> list[ToolCallDeltaOut]:
    return [
        ToolCallDeltaOut(
            index=p.index,
            id=p.id,
            type="function",
            function=FunctionDeltaOut(name=p.name, arguments=p.arguments),
        )
        if p.id
        else ToolCallDeltaOut(index=p.index, function=FunctionDeltaOut(arguments=p.arguments))
        for p in pieces
    ]


def whole(members: list[RequestSummary], opts: ChatOptions) -> Rendered:
    """The ``chat.completion`` of finished members (``opts``: the first's)."""
    first = members[0]
    spec = first.spec
    assert spec is not None
    choices = []
    prompt = completion = 0
    samples = opts.group is not None and opts.group.samples
    for i, s in enumerate(members):
        text = "".join(s.text)
        audio: Any = UNSET
        if s.audio_stage:
            data = encode_audio(s.all_audio(), s.sample_rate, s.audio_format)
            audio = AudioOut(
                id=f"audio-{s.request_id}",
                data=b64(data),
                expires_at=s.created + AUDIO_EXPIRES_S,
                transcript=text,
            )
        msg = AssistantMessage(content=text if s.text_stage else None, audio=audio)
        if s.reasoning:
            msg.reasoning_content = "".join(s.reasoning)
        if s.tool_calls:
            msg.tool_calls = tool_calls(s.tool_calls)
            msg.content = text or None
        lps = choice_logprobs(s.logprobs) if opts.logprobs else None
        choices.append(
            ChatChoice(index=i, message=msg, finish_reason=s.finish_reason(), logprobs=lps)
        )
        p, c = s.usage()
        # n choices of one prompt count the prompt once (as OpenAI does).
        prompt = p if samples else prompt + p
        completion += c
    rids = [s.request_id for s in members]
    body = ChatCompletion(
        id=f"chatcmpl-{group_id(opts.group) or first.request_id}",
        created=first.created,
        model=spec.model,
        choices=choices,
        usage=totals(prompt, completion),
        request_ids=rids,
    )
    return Rendered(json_head(200, rids), encode(body))


def stream_ids(opts: ChatOptions) -> bool:
    """Whether the stream's SSE events carry ``id:``: none before render
    version 2, every one in version 2, those of a resumable stream since."""
    if opts.render == 1:
        return False
    return True if opts.render == 2 else opts.resumable


class ChatStream(StreamTail):
    """One request's ``chat.completion.chunk`` stream, or (``member``) its
    choice in the stream of an n > 1 group (``core.groups.GroupStream``)."""

    def __init__(self, s: RequestSummary, opts: ChatOptions, member: bool = False) -> None:
        super().__init__(s, usage=opts.include_usage, member=member)
        spec = s.spec
        assert spec is not None
        group = opts.group if member else None
        self.index = group.index if group is not None else 0
        self.id = f"chatcmpl-{group_id(group) or s.request_id}"
        self.model = spec.model
        self.logprobs = opts.logprobs
        self.text_stage = opts.text_stage
        self.audio_stage = opts.audio_stage
        self.audio_id = f"audio-{s.request_id}"
        self.encoder: StreamEncoder | None = None
        if self.audio_stage:
            self.encoder = StreamEncoder(s.audio_format, s.sample_rate)

    def _chunk(
        self, delta: Delta, finish: str | None = None, logprobs: ChoiceLogprobs | None = None
    ) -> bytes:
        return sse(
            ChatCompletionChunk(
                id=self.id,
                created=self.s.created,
                model=self.model,
                choices=[
                    ChunkChoice(
                        index=self.index, delta=delta, finish_reason=finish, logprobs=logprobs
                    )
                ],
                usage=None if self.usage else UNSET,
            )
        )

    def usage_chunk(self, usage: Usage, created: int) -> bytes:
        return sse(
            ChatCompletionChunk(
                id=self.id, created=created, model=self.model, choices=[], usage=usage
            )
        )

    def admitted(self, ev: Admitted) -> list[bytes]:
        return [self._chunk(Delta(role="assistant", content=""))]

    def chunk(self, ev: Chunk) -> list[bytes]:
        if ev.stage == self.text_stage and ev.modality == "text":
            if ev.reasoning or ev.tool_calls:
                return [self._chunk(self._parsed(ev), None, self._logprobs(ev))]
            if self.logprobs and ev.logprobs:
                return [self._chunk(Delta(content=ev.text), None, choice_logprobs(ev.logprobs))]
            if not ev.text:
                return []
            return [self._chunk(Delta(content=ev.text))]
        if ev.stage == self.audio_stage and ev.modality == "audio" and self.encoder is not None:
            arr = self.s.chunk_audio(ev)
            data = self.encoder.write(arr) if arr is not None else b""
            return (
                [self._chunk(Delta(audio=AudioOut(id=self.audio_id, data=b64(data))))]
                if data
                else []
            )
        return []

    def _logprobs(self, ev: Chunk) -> ChoiceLogprobs | None:
        return choice_logprobs(ev.logprobs) if self.logprobs and ev.logprobs else None

    @staticmethod
    def _parsed(ev: Chunk) -> Delta:
        """A chunk a parser split: its answer, reasoning and calls' pieces."""
        d = Delta()
        if ev.text:
            d.content = ev.text
        if ev.reasoning:
            d.reasoning_content = ev.reasoning
        if ev.tool_calls:
            d.tool_calls = _delta_calls(ev.tool_calls)
        return d

    def finished(self, ev: Finished) -> list[bytes]:
        out = []
        if self.encoder is not None:
            tail = self.encoder.finish()
            audio = AudioOut(
                id=self.audio_id,
                data=b64(tail),
                expires_at=self.s.created + AUDIO_EXPIRES_S,
                transcript="".join(self.s.text),
            )
            out.append(self._chunk(Delta(audio=audio)))
        out.append(self._chunk(Delta(), self.s.finish_reason()))
        return self.closing(out)
