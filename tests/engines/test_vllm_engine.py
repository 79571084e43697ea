"""The vLLM engine on the tiny thinker and talker (one engine each for the
whole session): streaming text equals the decode of the streamed ids, seeds
reproduce, StageParams apply, abort stops generation inside vLLM, the
talker runs one sub-request per input piece as the pieces arrive, and a
continuation (``Resume``) picks up exactly where a lost replica stopped."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnix.events.types import BlobRef, ChatMessage, MediaPart, StageParams
from omnix.testing.media import gradient, tone
from omnix.transport.work import EngineOutput, GenerateRequest, InputPiece, PieceOutput, Resume

pytestmark = [
    pytest.mark.engines,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
    # The first test here waits for the engines' start-up (two vLLM engines,
    # four spawned processes): minutes on a busy 2-core machine.
    pytest.mark.timeout(900),
]


async def _feed(*pieces: InputPiece):
    for p in pieces:
        yield p


async def _run(
    engine, rid: str, *pieces: InputPiece, seed: int = 0, resume: Resume | None = None, **params
) -> list[EngineOutput]:
    req = GenerateRequest(rid, "s", StageParams(**params), seed=seed, resume=resume)
    return [o async for o in engine.generate(req, _feed(*pieces))]


def _ids(outs: list[EngineOutput]) -> list[int]:
    return [t for o in outs for t in o.token_ids]


async def _wait_idle(engine) -> None:
    """Until vLLM's front end holds no unfinished request (polled: vLLM
    offers no event for it)."""
    async with asyncio.timeout(5.0):
        while engine._llm.get_num_unfinished_requests():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_streams_deltas_whose_text_is_the_decode_of_their_ids(thinker) -> None:
    msg = InputPiece(messages=(ChatMessage("user", "Tell me a story about a cat."),))
    outs = await _run(thinker, "t-stream", msg, seed=11, temperature=1.0, max_tokens=40)
    payload = [o for o in outs if o.token_ids]
    assert len(payload) >= 10  # streamed, not one lump
    assert all(o.modality == "text" for o in outs)
    ids = _ids(outs)
    tok = thinker._tokenizer
    assert "".join(o.text for o in outs) == tok.decode(ids, skip_special_tokens=True)
    last = outs[-1]
    assert last.finish_reason in ("stop", "length")
    assert [o for o in outs if o.finish_reason] == [last]  # counts reported once
    assert last.output_tokens == len(ids) <= 40
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Tell me a story about a cat."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert last.prompt_tokens == len(tok.encode(chat, add_special_tokens=False))


async def test_same_seed_same_tokens_other_seed_other_tokens(thinker) -> None:
    piece = InputPiece(text="Hello! How are you today?")
    a, b, c = await asyncio.gather(
        _run(thinker, "t-seed-a", piece, seed=5, temperature=1.0, max_tokens=32),
        _run(thinker, "t-seed-b", piece, seed=5, temperature=1.0, max_tokens=32),
        _run(thinker, "t-seed-c", piece, seed=6, temperature=1.0, max_tokens=32),
    )
    assert _ids(a) == _ids(b)
    assert _ids(a) != _ids(c)
    # StageParams.seed overrides the request's seed.
    req = GenerateRequest(
        "t-seed-p", "s", StageParams(seed=5, temperature=1.0, max_tokens=32), seed=12345
    )
    d = [o async for o in thinker.generate(req, _feed(piece))]
    assert _ids(d) == _ids(a)


async def test_sampling_params_apply(thinker) -> None:
    piece = InputPiece(text="The quick brown fox")
    # max_tokens bounds the output; finish_reason says so.
    outs = await _run(thinker, "t-max", piece, temperature=1.0, max_tokens=7)
    assert len(_ids(outs)) == 7 and outs[-1].finish_reason == "length"
    # top_k=1 is greedy whatever the seed and temperature.
    g1 = await _run(thinker, "t-greedy-1", piece, seed=1, temperature=1.0, top_k=1, max_tokens=12)
    g2 = await _run(thinker, "t-greedy-2", piece, seed=2, temperature=0.0, max_tokens=12)
    assert _ids(g1) == _ids(g2)
    # A stop string ends generation where it first appears in the text.
    full = await _run(thinker, "t-nostop", piece, seed=3, temperature=1.0, max_tokens=48)
    text = "".join(o.text for o in full)
    stop = next((text[i : i + 2] for i in range(4, len(text) - 2) if text[i : i + 2].strip()), None)
    if stop is not None:
        cut = await _run(
            thinker, "t-stop", piece, seed=3, temperature=1.0, max_tokens=48, stop=(stop,)
        )
        assert "".join(o.text for o in cut) == text[: text.index(stop)]
        assert cut[-1].finish_reason == "stop"


async def test_input_modes_text_and_token_ids(thinker) -> None:
    tok = thinker._tokenizer
    text = "Numbers: 1 2 3"
    ids = tok.encode(text, add_special_tokens=False)
    # input_mode is read per call, so one started engine serves all three.
    chat = await _run(thinker, "t-mode-chat", InputPiece(text=text), max_tokens=4)
    old = _mode(thinker, "text")
    try:
        plain = await _run(
            thinker, "t-mode-text", InputPiece(text=text), max_tokens=4, temperature=0.0
        )
        assert plain[-1].prompt_tokens == len(ids) < chat[-1].prompt_tokens
        _mode(thinker, "token_ids")  # no layout in the thinker's omnix.json: ids as they are
        by_ids = await _run(
            thinker, "t-mode-ids", InputPiece(token_ids=tuple(ids)), max_tokens=4, temperature=0.0
        )
        assert _ids(by_ids) == _ids(plain)
    finally:
        _mode(thinker, old)


def _mode(engine, mode: str) -> str:
    import msgspec

    old = engine.args.input_mode
    engine.args = msgspec.structs.replace(engine.args, input_mode=mode)
    return old


async def test_abort_mid_stream_stops_generation_in_vllm(thinker) -> None:
    req = GenerateRequest("t-abort", "s", StageParams(temperature=1.0, max_tokens=400), seed=1)
    seen = 0
    after = 0
    aborted = False
    async for out in thinker.generate(req, _feed(InputPiece(text="Write a long story."))):
        if aborted:
            after += 1
        seen += len(out.token_ids)
        if seen >= 5 and not aborted:
            await thinker.abort("t-abort")
            aborted = True
    assert aborted and after == 0, "outputs after abort"
    assert seen < 400
    await _wait_idle(thinker)  # vLLM itself holds nothing for it any more
    await thinker.abort("t-abort")  # idempotent
    await thinker.abort("unknown-id")  # ignored


async def test_an_abort_vllm_makes_on_its_own_ends_generate_with_engine_dead(thinker) -> None:
    """vLLM aborts what runs only when its engine core stops serving (a
    SIGTERM'd engine core does: tests/http/test_engines_self_abort.py;
    here, in process, a pause in abort mode).  That is no acknowledgement
    of an abort omnix asked for: ``generate`` raises ``EngineDead``, so the
    worker exits and the request continues elsewhere or fails, instead of
    ending its stage as "aborted" (a finish nobody waits for)."""
    from omnix.stages.engine import EngineDead

    req = GenerateRequest("t-self-abort", "s", StageParams(temperature=1.0, max_tokens=400), seed=4)
    outs: list[EngineOutput] = []
    try:
        with pytest.raises(EngineDead, match="aborted sub-request t-self-abort#0 on its own"):
            async for out in thinker.generate(req, _feed(InputPiece(text="Write a long story."))):
                outs.append(out)
                if len(outs) == 2:
                    await thinker._llm.pause_generation(mode="abort", clear_cache=False)
    finally:
        await thinker._llm.resume_generation()
    assert 2 <= len(outs) and not any(o.finish_reason for o in outs)
    assert "t-self-abort" not in thinker._requests
    await _wait_idle(thinker)
    # The engine serves again once vLLM resumes.
    again = await _run(thinker, "t-after-pause", InputPiece(text="Hello"), max_tokens=4)
    assert again[-1].finish_reason in ("stop", "length")


async def test_cancelling_the_consumer_aborts_in_vllm(thinker) -> None:
    req = GenerateRequest("t-cancel", "s", StageParams(temperature=1.0, max_tokens=400), seed=2)

    streaming = asyncio.Event()

    async def consume():
        async for _ in thinker.generate(req, _feed(InputPiece(text="Write a long story."))):
            streaming.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(streaming.wait(), 60)  # mid-stream, not before it starts
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _wait_idle(thinker)


async def test_an_input_that_ends_or_fails_before_its_first_piece(thinker) -> None:
    # No input at all: nothing is generated, one finish with zero counts.
    (only,) = await _run(thinker, "t-empty")
    assert only.finish_reason == "stop" and only.prompt_tokens == only.output_tokens == 0
    assert not only.token_ids and not only.text

    async def broken():
        raise ConnectionError("upstream went away")
        yield  # pragma: no cover

    with pytest.raises(ConnectionError, match="upstream went away"):
        async for _ in thinker.generate(GenerateRequest("t-broken", "s", StageParams()), broken()):
            pass
    assert "t-broken" not in thinker._requests


async def test_talker_speaks_each_piece_as_it_arrives(talker) -> None:
    second_may_come = asyncio.Event()
    sent = []

    async def pieces():
        sent.append(0)
        yield InputPiece(text="Hello there.", token_ids=(10, 20, 30))
        await second_may_come.wait()  # the thinker is "still writing"
        sent.append(1)
        yield InputPiece(text=" How are you?")  # text only: the talker tokenizes it

    req = GenerateRequest("k-pieces", "talker", StageParams(temperature=1.0, max_tokens=24), seed=4)
    outs = []
    async for out in talker.generate(req, pieces()):
        outs.append((len(sent), out))
        second_may_come.set()  # only once codes for the first piece came out
    payload = [o for _, o in outs if o.token_ids]
    assert payload and outs[0][0] == 1, "the talker waited for the second piece"
    codes = _ids(payload)
    assert all(o.modality == "codec" for _, o in outs)
    assert all(len(o.token_ids) % 2 == 0 for o in payload)  # whole frames only
    assert all(0 <= c < 1024 for c in codes)
    last = outs[-1][1]
    assert last.finish_reason in ("stop", "length")
    assert last.output_tokens >= len(codes) and len(codes) <= 48
    assert last.prompt_tokens > 4 + 1  # both pieces' prompts (ids + codec bos)


async def test_talker_same_seed_same_codes_and_abort(talker) -> None:
    piece = InputPiece(token_ids=(5, 6, 7, 8))
    a = await _run(talker, "k-a", piece, seed=8, temperature=1.0, max_tokens=20)
    b = await _run(talker, "k-b", piece, seed=8, temperature=1.0, max_tokens=20)
    assert _ids(a) == _ids(b) and len(_ids(a)) > 0

    # Abort during the second sub-request: no output after it, vLLM idle.
    gate = asyncio.Event()

    async def pieces():
        yield InputPiece(token_ids=(1, 2, 3))
        await gate.wait()
        yield InputPiece(token_ids=(4, 5, 6))

    req = GenerateRequest("k-abort", "talker", StageParams(temperature=1.0, max_tokens=60), seed=1)
    aborted, after = False, 0
    async for _out in talker.generate(req, pieces()):
        if aborted:
            after += 1
            continue
        gate.set()
        live = talker._requests.get("k-abort")
        if live is not None and live.sub_id == "k-abort#1":
            await talker.abort("k-abort")
            aborted = True
    assert aborted, "never saw the second sub-request live"
    assert after == 0
    await _wait_idle(talker)


async def test_talker_text_mode_maps_text_into_its_vocabulary(talker) -> None:
    """tiny-tts feeds the talker the request's text (input_mode "text"): the
    ids must be shifted into the talker's text range exactly as in
    token_ids mode, so both give the same codes."""
    text = "Hello there."
    ids = talker._tokenizer.encode(text, add_special_tokens=False)
    by_ids = await _run(
        talker, "k-ids", InputPiece(token_ids=tuple(ids)), seed=2, temperature=1.0, max_tokens=16
    )
    old = _mode(talker, "text")
    try:
        by_text = await _run(
            talker, "k-text", InputPiece(text=text), seed=2, temperature=1.0, max_tokens=16
        )
    finally:
        _mode(talker, old)
    assert _ids(by_text) == _ids(by_ids) and _ids(by_ids)
    assert by_text[-1].prompt_tokens == len(ids) + 1  # + codec bos


async def test_talker_codes_decode_exactly_through_the_codec_engine(talker, codec_engine) -> None:
    req = GenerateRequest("k-codec", "talker", StageParams(temperature=1.0, max_tokens=64), seed=3)

    async def codec_pieces():
        async for out in talker.generate(req, _feed(InputPiece(token_ids=(40, 41, 42)))):
            if out.token_ids:
                yield InputPiece(token_ids=out.token_ids, modality="codec")
                all_codes.extend(out.token_ids)

    all_codes: list[int] = []
    outs = [
        o
        async for o in codec_engine.generate(
            GenerateRequest("c-k", "code2wav", StageParams()), codec_pieces()
        )
    ]
    pcm = np.concatenate([o.array for o in outs if o.array is not None])
    assert pcm.size == len(all_codes) // 2 * 320 > 0
    np.testing.assert_array_equal(pcm, codec_engine.decoder.decode(all_codes))


# -- continuation of a migrated execution ------------------------------------------


async def _resume_after(engine, rid: str, piece: InputPiece, k: int, n: int, **params):
    """The outputs a replica delivered before it was lost after ``k`` tokens
    (a run with ``max_tokens=k``), then those of a fresh continuation with
    the budget ``n``, as another replica would run it."""
    before = await _run(engine, f"{rid}-before", piece, max_tokens=k, **params)
    delivered = [o for o in before if o.token_ids]
    resume = Resume(
        chunks=len(delivered),
        token_ids=tuple(_ids(delivered)),
        text="".join(o.text for o in delivered),
    )
    await _as_another_replica(engine)
    after = await _run(engine, f"{rid}-after", piece, resume=resume, max_tokens=n, **params)
    return before, after


async def _as_another_replica(engine) -> None:
    """Empties vLLM's prefix cache and its multimodal processor caches (the
    front end's record of items sent, the engine core's items): a
    continuation runs on another replica, which never saw this request."""
    await engine._llm.reset_prefix_cache()
    await engine._llm.reset_mm_cache()


async def test_continuation_equals_the_undisturbed_run(thinker) -> None:
    """Greedy: the tokens and text delivered before the cut plus the
    continuation's equal the undisturbed run's, token for token and text
    for text, at every cut; the final counts are the undisturbed run's.

    Exact, not a prefix: on this CPU build vLLM's prefill of prompt + ids
    gives bit-identical logprobs to the decode steps it replaces (measured:
    docs/engines.md, "Continuing a migrated execution")."""
    n = 24
    piece = InputPiece(messages=(ChatMessage("user", "Tell me a story about a cat."),))
    whole = await _run(thinker, "t-res-whole", piece, max_tokens=n, temperature=0.0)
    ids, text = _ids(whole), "".join(o.text for o in whole)
    assert (
        len(ids) == n and whole[-1].finish_reason == "length"
    )  # the tiny model rarely stops early
    for k in range(1, n + 1):
        before, after = await _resume_after(thinker, f"t-res-{k}", piece, k, n, temperature=0.0)
        assert _ids(before) == ids[:k]
        assert _ids(before) + _ids(after) == ids, f"cut after {k} tokens"
        got = "".join(o.text for o in before if o.token_ids) + "".join(o.text for o in after)
        assert got == text, f"cut after {k} tokens"
        last = after[-1]
        assert [o for o in after if o.finish_reason] == [last]
        assert (last.prompt_tokens, last.output_tokens, last.finish_reason) == (
            whole[-1].prompt_tokens,
            n,
            "length",
        )
    # Nothing left of the budget: finished at once, nothing emitted.
    (only,) = after
    assert not only.token_ids and not only.text


async def test_continuation_text_keeps_a_character_split_across_the_cut(tiny_models) -> None:
    """A byte-level BPE spells a multi-byte character over several tokens.
    Cut between them, the text delivered before holds none of it (the
    detokenizer waits for the whole character) and the continuation must
    bring the whole character, once.  (The greedy test above cuts inside
    the tiny model's own byte tokens, where vLLM's detokenizer first
    failed; its random output never completes a real character, so this
    checks the text assembly on real text, with the model's tokenizer.)"""
    from transformers import AutoTokenizer

    from omnix.engines.vllm_resume import ContinuedText

    tok = AutoTokenizer.from_pretrained(str(tiny_models.path("thinker")))
    text = "Un café ☕, très naïve: 你好 мир!"
    ids = tok.encode(text, add_special_tokens=False)
    inside = [k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd")]
    assert inside, "the tokenizer spells no character over several tokens"
    for k in range(len(ids) + 1):
        delivered = tok.decode(ids[:k]).rstrip("\ufffd")
        cont = ContinuedText(tok, tuple(ids[:k]), delivered)
        rest = [cont.delta((t,), None) for i, t in enumerate(ids) if i >= k]
        assert all("\ufffd" not in d for d in rest), f"cut after {k} tokens"
        assert delivered + "".join(rest) == text, f"cut after {k} tokens"
    # A stop string inside the continuation ends the text before it.
    k = len(ids) // 2
    delivered = tok.decode(ids[:k]).rstrip("\ufffd")
    cont = ContinuedText(tok, tuple(ids[:k]), delivered)
    assert cont.delta(tuple(ids[k:]), "мир") == text[len(delivered) : text.index("мир")]


async def test_seeded_continuation_reports_exact_counts(thinker) -> None:
    """Sampling: the continuation cannot re-draw the lost replica's random
    numbers, but it never re-emits the resumed tokens, keeps to the budget,
    and counts as an undisturbed run would; the same seed reproduces it."""
    piece = InputPiece(text="Hello! How are you today?")
    before, a = await _resume_after(thinker, "t-res-seed-a", piece, 7, 30, seed=5, temperature=1.0)
    _, b = await _resume_after(thinker, "t-res-seed-b", piece, 7, 30, seed=5, temperature=1.0)
    assert _ids(a) == _ids(b)
    assert len(_ids(a)) == 30 - 7 or a[-1].finish_reason == "stop"
    assert a[-1].output_tokens == 7 + len(_ids(a))
    assert a[-1].prompt_tokens == before[-1].prompt_tokens


async def test_talker_continuation_equals_the_undisturbed_codes(talker) -> None:
    """Codec codes (offsets removed, whole frames) resume as well: mapped
    back into the talker's vocabulary, they continue exactly."""
    piece = InputPiece(token_ids=(40, 41, 42))
    whole = await _run(talker, "k-res-whole", piece, max_tokens=30, temperature=0.0)
    codes = _ids(whole)
    assert len(codes) >= 10
    for k in (2, 8, 14):  # whole frames, as the talker delivers them
        before, after = await _resume_after(talker, f"k-res-{k}", piece, k, 30, temperature=0.0)
        assert _ids(before) == codes[:k]
        assert _ids(before) + _ids(after) == codes, f"cut after {k} codes"
        assert after[-1].output_tokens == whole[-1].output_tokens
        assert after[-1].prompt_tokens == whole[-1].prompt_tokens


async def test_continuation_of_several_pieces_is_refused(talker) -> None:
    resume = Resume(chunks=1, token_ids=(1, 2))
    with pytest.raises(ValueError, match="more than one input piece"):
        await _run(
            talker,
            "k-res-pieces",
            InputPiece(token_ids=(1, 2, 3)),
            InputPiece(token_ids=(4, 5)),
            resume=resume,
            max_tokens=8,
            temperature=0.0,
        )
    assert "k-res-pieces" not in talker._requests


def _pieces(outs: list[EngineOutput]) -> list[int]:
    """The input piece of every output token id, in order."""
    return [o.piece for o in outs for _ in o.token_ids]


def _resume_of(delivered: list[EngineOutput]) -> Resume:
    """The ``Resume`` the orchestrator builds from these delivered outputs'
    chunks (``Dispatcher.resume``: split by ``Chunk.piece``)."""
    pieces: list[PieceOutput] = []
    for o in delivered:
        pieces += [PieceOutput()] * (o.piece + 1 - len(pieces))
        p = pieces[o.piece]
        pieces[o.piece] = PieceOutput(
            p.chunks + 1, p.token_ids + len(o.token_ids), p.text + len(o.text)
        )
    return Resume(
        chunks=len(delivered),
        token_ids=tuple(_ids(delivered)),
        text="".join(o.text for o in delivered),
        pieces=tuple(pieces),
    )


async def test_talker_continuation_of_several_pieces_at_every_cut(talker) -> None:
    """The talker fed sentence by sentence (one sub-request per piece, an
    empty piece among them) and cut after every chunk: the delivered
    chunks plus the continuation's equal the undisturbed run, code for
    code and piece for piece; finished pieces do not run again, and the
    final counts are the undisturbed run's."""
    pieces = (
        InputPiece(token_ids=(40, 41, 42)),
        InputPiece(),  # nothing to say: no sub-request, but it is piece 1
        InputPiece(token_ids=(7, 8, 9, 10)),
        InputPiece(token_ids=(99,)),
    )
    whole = await _run(talker, "k-mp-whole", *pieces, max_tokens=8, temperature=0.0)
    payload = [o for o in whole if o.token_ids]
    assert {o.piece for o in payload} == {0, 2, 3}  # each non-empty piece spoke
    assert [o.piece for o in payload] == sorted(o.piece for o in payload)
    for k in range(1, len(payload) + 1):
        resume = _resume_of(payload[:k])
        await talker._llm.reset_prefix_cache()
        after = await _run(
            talker, f"k-mp-{k}", *pieces, resume=resume, max_tokens=8, temperature=0.0
        )
        rest = [o for o in after if o.token_ids]
        assert _ids(payload[:k]) + _ids(rest) == _ids(payload), f"cut after chunk {k}"
        # Per code, not per chunk: vLLM may group a continuation's first
        # frames in one delta.
        assert _pieces(payload[:k] + rest) == _pieces(payload), f"cut after chunk {k}"
        last = after[-1]
        assert [o for o in after if o.finish_reason] == [last]
        assert (last.prompt_tokens, last.output_tokens, last.finish_reason) == (
            whole[-1].prompt_tokens,
            whole[-1].output_tokens,
            whole[-1].finish_reason,
        ), f"cut after chunk {k}"


async def test_thinker_continuation_of_several_pieces_keeps_each_pieces_text(thinker) -> None:
    """Text splits by piece too: the cut piece's text continues from its
    own delivered text (not the whole resume's), the later piece starts
    fresh."""
    pieces = (InputPiece(text="Hello! How are you today?"), InputPiece(text="Tell me a story."))
    whole = await _run(thinker, "t-mp-whole", *pieces, max_tokens=6, temperature=0.0)
    payload = [o for o in whole if o.token_ids]
    text = "".join(o.text for o in whole)
    assert {o.piece for o in payload} == {0, 1}
    for k in range(1, len(payload) + 1):
        await thinker._llm.reset_prefix_cache()
        after = await _run(
            thinker,
            f"t-mp-{k}",
            *pieces,
            resume=_resume_of(payload[:k]),
            max_tokens=6,
            temperature=0.0,
        )
        assert _ids(payload[:k]) + _ids(after) == _ids(payload), f"cut after chunk {k}"
        got = "".join(o.text for o in payload[:k]) + "".join(o.text for o in after)
        assert got == text, f"cut after chunk {k}"
    # A text piece delivers the EOS it stopped on: one whose delivered ids
    # end with it had finished, and only the next piece runs.
    eos = thinker._tokenizer.eos_token_id
    assert eos in thinker._eos_ids
    first = [*[t for o in payload if o.piece == 0 for t in o.token_ids][:3], eos]
    ended = Resume(chunks=2, token_ids=tuple(first), pieces=(PieceOutput(2, len(first), 0),))
    after = await _run(thinker, "t-mp-eos", *pieces, resume=ended, max_tokens=6, temperature=0.0)
    assert _ids(after) == [t for o in payload if o.piece == 1 for t in o.token_ids]
    assert {o.piece for o in after if o.token_ids} == {1}


def _media_piece(width: int) -> InputPiece:
    """A chat piece with a 1 s tone and a ``width``-pixel-wide gradient
    (another width, other image items for vLLM's caches)."""
    audio, image = tone(1.0, 16_000), gradient(width, 224)
    parts = (
        MediaPart("audio", BlobRef("a", audio.nbytes, "float32", audio.shape), at=0, rate=16_000),
        MediaPart("image", BlobRef(f"i{width}", image.nbytes, "uint8", image.shape), at=0),
    )
    return InputPiece(
        messages=(ChatMessage("user", "Describe them.", media=parts),), media=(audio, image)
    )


async def test_media_continuation_equals_the_undisturbed_run(omni_thinker) -> None:
    """A continuation of a chat with audio and an image, on a replica that
    never saw the items, equals the undisturbed run with the same prompt
    count.  The prompt plus the resumed ids is rendered once: a second
    render of the same items sends only their hashes, which the engine
    core does not hold, and vLLM ends the request with an error."""
    n = 8
    piece = _media_piece(320)
    whole = await _run(omni_thinker, "m-whole", piece, max_tokens=n, temperature=0.0)
    ids = _ids(whole)
    assert len(ids) == n and whole[-1].prompt_tokens > 80  # the items' tokens are in the prompt
    for k in (1, n // 2):
        before, after = await _resume_after(
            omni_thinker, f"m-res-{k}", piece, k, n, temperature=0.0
        )
        assert _ids(before) + _ids(after) == ids, f"cut after {k} tokens"
        assert (after[-1].prompt_tokens, after[-1].output_tokens, after[-1].finish_reason) == (
            whole[-1].prompt_tokens,
            n,
            "length",
        )


async def test_a_finished_media_piece_is_not_sent_and_leaves_its_items_unsent(omni_thinker) -> None:
    """A resumed piece that had finished (its delivered ids end with EOS)
    does not run again; its items, rendered only to count the prompt, are
    not recorded as sent, so the next request with them still works."""
    eos = omni_thinker._tokenizer.eos_token_id
    piece = _media_piece(288)  # items this engine has not sent before
    await _as_another_replica(omni_thinker)
    ended = Resume(chunks=1, token_ids=(5, 6, eos), pieces=(PieceOutput(1, 3, 0),))
    after = await _run(omni_thinker, "m-eos", piece, resume=ended, max_tokens=8, temperature=0.0)
    (only,) = after
    assert not only.token_ids and only.finish_reason == "stop"
    fresh = await _run(omni_thinker, "m-fresh", piece, max_tokens=8, temperature=0.0)
    assert fresh[-1].finish_reason == "length" and len(_ids(fresh)) == 8
    assert only.prompt_tokens == fresh[-1].prompt_tokens
