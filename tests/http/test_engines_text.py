"""``tiny-text`` (one vLLM stage) end to end on its real engine: the
official ``openai`` client against a real worker process; the text it
reads is the decode of the token ids on the log, and a seed reproduces
them."""

from __future__ import annotations

from omnix.events.types import Chunk, StageFinished

from .conftest import real_engine_marks

PIPELINE = "tiny-text"
pytestmark = real_engine_marks()

USER = [{"role": "user", "content": "Tell me about the sea."}]


def _logged_ids(server, rid: str) -> list[int]:
    events = server.omni.log.events_for(rid)
    return [t for e in events if isinstance(e, Chunk) for t in e.token_ids]


async def test_streamed_text_is_the_decode_of_the_logged_token_ids(server, client):
    from transformers import AutoTokenizer

    from omnix.models.paths import resolve_model

    stream = await client.chat.completions.create(
        model="tiny-text",
        messages=USER,
        seed=5,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, rid, usage = [], None, None
    async for chunk in stream:
        rid = rid or chunk.id.removeprefix("chatcmpl-")
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    ids = _logged_ids(server, rid)
    assert 0 < len(ids) <= 24
    tok = AutoTokenizer.from_pretrained(str(resolve_model("thinker")))
    assert "".join(text) == tok.decode(ids, skip_special_tokens=True)
    (fin,) = [e for e in server.omni.log.events_for(rid) if isinstance(e, StageFinished)]
    assert fin.output_tokens == len(ids) == usage.completion_tokens
    assert fin.finish_reason in ("stop", "length")


async def test_the_same_seed_gives_the_same_tokens(server, client):
    async def ids(seed: int) -> list[int]:
        resp = await client.chat.completions.create(
            model="tiny-text", messages=USER, seed=seed, temperature=1.0, max_tokens=24
        )
        assert resp.choices[0].message.content
        return _logged_ids(server, resp.id.removeprefix("chatcmpl-"))

    first = await ids(21)
    assert await ids(21) == first
    assert await ids(22) != first  # sampled, so the seed is what made them equal
