"""Completions' bytes, as a pure function of the request's events.

Owns: the whole ``text_completion`` of one request or of a batch's members
(``whole``), the ``text_completion`` SSE stream (``CompletionStream``: a
chunk per text chunk, the echoed prompt before the first, a finish chunk,
an optional usage chunk, ``[DONE]``; errors as on chat), the legacy
``logprobs`` as vLLM writes them, and which SSE events carry ``id:``.

Does not own the dispatch over APIs nor the entry points
(``omnix.http.render``).
"""

from __future__ import annotations

from collections.abc import Iterable

from msgspec import UNSET

from omnix.events.options import CompletionOptions
from omnix.events.types import Admitted, Chunk, Finished, TokenLogprob
from omnix.http.common.fields import Usage
from omnix.http.common.rendering import (
    Rendered,
    StreamTail,
    encode,
    group_id,
    json_head,
    sse,
    totals,
)
from omnix.http.common.summary import RequestSummary
from omnix.http.completions.protocol import Completion, CompletionChoice, CompletionLogprobs


def completion_logprobs(lps: Iterable[TokenLogprob], offset: int = 0) -> CompletionLogprobs:
    """OpenAI's legacy ``choices[].logprobs`` as vLLM's /v1/completions
    writes it: per token its text and logprob, ``{token: logprob}`` of the
    token itself then its recorded alternatives (most likely first; a text
    twice is one key, the later value, as vLLM's dict), and the offset of
    the token in the choice's text (``offset`` for the first: the text
    before this piece)."""
    out = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
    for lp in lps:
        out.text_offset.append(offset)
        offset += len(lp.token)
        out.tokens.append(lp.token)
        out.token_logprobs.append(lp.logprob)
        top = {lp.token: lp.logprob}
        for t, v in lp.top:
            top[t] = v
        out.top_logprobs.append(top)
    return out


def whole(members: list[RequestSummary], opts: CompletionOptions) -> Rendered:
    """The ``text_completion`` of finished members (``opts``: the first's)."""
    first = members[0]
    spec = first.spec
    assert spec is not None
    choices = []
    prompt = completion = 0
    samples = opts.group is not None and opts.group.samples
    for i, s in enumerate(members):
        echo = s.spec.prompt if s.spec is not None and opts.echo else ""
        lps = completion_logprobs(s.logprobs) if opts.logprobs else None
        choices.append(
            CompletionChoice(
                index=i,
                text=echo + "".join(s.text),
                logprobs=lps,
                finish_reason=s.finish_reason(),
            )
        )
        p, c = s.usage()
        prompt = p if samples else prompt + p
        completion += c
    rids = [s.request_id for s in members]
    body = Completion(
        id=f"cmpl-{group_id(opts.group) or first.request_id}",
        created=first.created,
        model=spec.model,
        choices=choices,
        usage=totals(prompt, completion),
        request_ids=rids,
    )
    return Rendered(json_head(200, rids), encode(body))


def stream_ids(opts: CompletionOptions) -> bool:
    """Whether the stream's SSE events carry ``id:``: a resumable stream's."""
    return opts.render != 1 and opts.resumable


class CompletionStream(StreamTail):
    """One request's ``text_completion`` stream, or (``member``) its choice
    in the stream of an n > 1 group."""

    def __init__(self, s: RequestSummary, opts: CompletionOptions, member: bool = False) -> None:
        super().__init__(s, usage=opts.include_usage, member=member)
        spec = s.spec
        assert spec is not None
        group = opts.group if member else None
        self.index = group.index if group is not None else 0
        self.id = f"cmpl-{group_id(group) or s.request_id}"
        self.model = spec.model
        self.logprobs = opts.logprobs
        self.text_stage = opts.text_stage
        #: the prompt, until it went out before the first text
        self.echo = spec.prompt if opts.echo else ""
        #: length of the text sent so far (logprobs' text_offset)
        self.sent = 0

    def _chunk(
        self, text: str, finish: str | None = None, logprobs: CompletionLogprobs | None = None
    ) -> bytes:
        return sse(
            Completion(
                id=self.id,
                created=self.s.created,
                model=self.model,
                choices=[
                    CompletionChoice(
                        index=self.index, text=text, logprobs=logprobs, finish_reason=finish
                    )
                ],
                usage=None if self.usage else UNSET,
            )
        )

    def usage_chunk(self, usage: Usage, created: int) -> bytes:
        return sse(
            Completion(id=self.id, created=created, model=self.model, choices=[], usage=usage)
        )

    def _text(self, text: str) -> str:
        text, self.echo = self.echo + text, ""
        return text

    def admitted(self, ev: Admitted) -> list[bytes]:
        return []

    def chunk(self, ev: Chunk) -> list[bytes]:
        if ev.stage != self.text_stage or ev.modality != "text":
            return []
        if self.logprobs and ev.logprobs:
            lps = completion_logprobs(ev.logprobs, self.sent)
            self.sent += sum(len(lp.token) for lp in ev.logprobs)
            return [self._chunk(self._text(ev.text), None, lps)]
        if not ev.text:
            return []
        return [self._chunk(self._text(ev.text))]

    def finished(self, ev: Finished) -> list[bytes]:
        return self.closing([self._chunk(self._text(""), self.s.finish_reason())])
