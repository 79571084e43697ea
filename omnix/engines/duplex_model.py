"""Moshi as a step function: one 80 ms tick of many full-duplex sessions.

Owns: ``DuplexModel``, which loads a Moshi checkpoint (transformers'
``MoshiForConditionalGeneration``: temporal transformer, depth decoder,
Mimi) and computes exactly what transformers'
``MoshiForConditionalGeneration.generate`` computes, split so that a
serving engine can drive it frame by frame:

- ``start``: a session's first positions in one forward (the "initial"
  frame, then an optional prompt of frames whose text, Moshi codes and user
  codes are given: generate's ``input_ids`` / ``moshi_audio_codes`` /
  ``user_audio_codes``), returning its own KV cache and state;
- ``step``: one tick of a batch of sessions (each with its own KV cache,
  rows of one ``BatchCache``): each session's user frame in, the temporal
  transformer one position, the text token from its head, the depth
  decoder for the next frame's codes, each session's model frame out.

Alignment (transformers' own, its ``build_delay_pattern_mask``): the
semantic codebook (0) is not delayed, the acoustic ones (1..K-1) one frame,
for Moshi's stream and the user's alike.  Position ``p`` of the temporal
transformer reads the text token ``text[p]``, Moshi's ``sem[p]`` and
``acoustic[p-1]``, the user's ``sem[p]`` and ``acoustic[p-1]``; its hidden
state gives ``text[p+1]`` and, through the depth decoder, ``sem[p+1]`` and
``acoustic[p]``.  So the tick that takes user frame ``p`` completes Moshi's
frame ``p`` (its acoustic codes) and returns it with its text token
(``Frame``); ``text[p+1]`` and ``sem[p+1]`` wait in the session's state.
Position 0 is the initial frame (the text vocabulary's size, the audio
vocabulary's size in every codebook: generate's unconditional input), so
the first user frame is frame 1.

A step is a pure function of the sessions' states and user frames: the
only randomness is each session's own ``torch.Generator`` (seeded by its
``Sampling.seed``) when it samples; greedy sessions draw nothing.  Replaying
a session's user frames from ``start`` gives its frames again.

Does not own: Mimi's streaming decode (``mimi_stream.py``), which
sessions share a batch (``duplex_batch.py``), pacing ticks, nor the persona prompt
PersonaPlex reads (a voice and a role text: later work; its voice prompt is
a ``Prompt`` of forced frames).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from omnix.engines.talker_model import BatchCache


@dataclass(frozen=True)
class DuplexLayout:
    """What the engine reads of a Moshi ``config.json``."""

    text_vocab: int  # also the "initial" text token
    audio_vocab: int  # codes per codebook; also the "initial" audio token
    num_codebooks: int  # Moshi's (and the user's) codebooks a frame
    frame_samples: int  # PCM samples a frame (1920 at 24 kHz: 80 ms)
    sample_rate: int
    context: int  # positions a session may reach (the KV cache's window)

    @classmethod
    def of(cls, cfg: Any) -> DuplexLayout:
        mimi = cfg.audio_encoder_config
        return cls(
            text_vocab=cfg.vocab_size,
            audio_vocab=cfg.audio_vocab_size,
            num_codebooks=cfg.num_codebooks,
            frame_samples=int(mimi.frame_size),
            sample_rate=int(mimi.sampling_rate),
            context=int(cfg.sliding_window or cfg.max_position_embeddings),
        )


@dataclass(frozen=True)
class Sampling:
    """How a session's tokens are chosen: greedy where a temperature is 0
    (the default), else temperature and top-k from the session's own
    generator, seeded by ``seed``."""

    text_temperature: float = 0.0
    text_top_k: int = 25
    audio_temperature: float = 0.0
    audio_top_k: int = 250
    seed: int = 0

    @property
    def samples(self) -> bool:
        return self.text_temperature > 0 or self.audio_temperature > 0


@dataclass(frozen=True)
class Frame:
    """One frame of Moshi's output: its text token and its audio codes."""

    text: int
    codes: tuple[int, ...]


@dataclass(frozen=True)
class Prompt:
    """Frames a session starts with, given rather than generated (transformers'
    ``input_ids``, ``moshi_audio_codes`` and ``user_audio_codes`` of equal
    length): ``text`` [T], ``moshi`` and ``user`` [K, T] (undelayed)."""

    text: torch.Tensor
    moshi: torch.Tensor
    user: torch.Tensor

    def __post_init__(self) -> None:
        t = self.text.shape[-1]
        if self.moshi.shape[-1] != t or self.user.shape[-1] != t:
            raise ValueError(
                f"a prompt's text, moshi and user frames must be as many: got {t}, "
                f"{self.moshi.shape[-1]} and {self.user.shape[-1]}"
            )


@dataclass
class Session:
    """One session's decoding state between ticks (its KV cache is a row of
    the batch's ``BatchCache``)."""

    length: int  # positions in its KV cache
    text: int  # text token of the next position
    semantic: int  # Moshi's semantic code of the next position
    acoustic: list[int]  # Moshi's acoustic codes of the last frame (delayed by one)
    user_acoustic: list[int]  # the user's acoustic codes of the last frame
    sampling: Sampling = field(default_factory=Sampling)
    generator: torch.Generator | None = None


class DuplexModel:
    """A Moshi checkpoint's temporal transformer, depth decoder and Mimi, on
    one device."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.layout = DuplexLayout.of(model.config)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.mimi = model.audio_encoder
        self._temporal = model.decoder.model
        self._text_head = model.decoder.lm_head
        self._depth = model.depth_decoder
        self._embeddings = model.embed_tokens  # Moshi's K, then the user's K

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: str = "float32") -> DuplexModel:
        """Load a transformers Moshi folder (``model_type: moshi``)."""
        import torch
        from transformers import MoshiForConditionalGeneration

        # Any: mypy misreads the decorated classmethod's signature.
        moshi: Any = MoshiForConditionalGeneration
        model = moshi.from_pretrained(
            str(folder),
            dtype=getattr(torch, dtype),
            attn_implementation="sdpa",
            local_files_only=True,
        )
        return cls(model.to(device).eval())

    # -- sessions ------------------------------------------------------------------

    def new_cache(self) -> BatchCache:
        """An empty batch of sessions' KV caches (full attention: a session
        ends at the layout's ``context``, inside which transformers' sliding
        window of that width drops nothing)."""
        from omnix.engines.talker_model import BatchCache

        return BatchCache(None)

    def start(
        self, prompt: Prompt | None = None, sampling: Sampling | None = None
    ) -> tuple[Any, Session]:
        """A session's first positions: the initial frame, then ``prompt``'s
        frames, in one forward; then its first text token and semantic code.
        Returns ``(cache, session)``: its own KV cache (``BatchCache.add`` it
        with ``session.length``) and its state."""
        import torch
        from transformers import DynamicCache

        lay = self.layout
        sampling = sampling or Sampling()
        k = lay.num_codebooks
        t = 0 if prompt is None else int(prompt.text.shape[-1])
        if t + 1 >= lay.context:
            raise ValueError(f"a prompt of {t} frames leaves no room in a context of {lay.context}")
        initial_text = torch.full((1,), lay.text_vocab, dtype=torch.long)
        initial_audio = torch.full((k, 1), lay.audio_vocab, dtype=torch.long)
        if prompt is None:
            text, moshi, user = initial_text, initial_audio, initial_audio
        else:
            text = torch.cat([initial_text, prompt.text.reshape(-1).long()])
            moshi = torch.cat([initial_audio, prompt.moshi.reshape(k, t).long()], dim=1)
            user = torch.cat([initial_audio, prompt.user.reshape(k, t).long()], dim=1)
        codes = torch.cat([_delayed(moshi, lay.audio_vocab), _delayed(user, lay.audio_vocab)])
        embeds = self._embed(text[None].to(self.device), codes[None].to(self.device))
        cache = DynamicCache()
        generator = _generator(sampling, self.device)
        with torch.inference_mode():
            out = self._temporal(
                inputs_embeds=embeds,
                attention_mask=torch.ones(1, t + 1, dtype=torch.long, device=self.device),
                past_key_values=cache,
                use_cache=True,
            )
            hidden = out.last_hidden_state[:, -1]
            session = Session(
                length=t + 1,
                text=0,
                semantic=0,
                acoustic=moshi[1:, -1].tolist(),
                user_acoustic=user[1:, -1].tolist(),
                sampling=sampling,
                generator=generator,
            )
            nxt = self._choose_text(self._text_head(hidden), [session])
            first = self._depth_codes(hidden, nxt, [session])
        session.text, session.semantic = int(nxt[0]), int(first[0, 0])
        return cache, session

    def step(
        self,
        caches: BatchCache,
        sessions: list[Session],
        user: torch.Tensor,
        forced: list[Frame | None] | None = None,
    ) -> list[Frame]:
        """One tick of a batch: ``user`` [B, K] holds each session's user
        frame (Mimi's first K codes of its 80 ms).  Returns each session's
        Moshi frame, the one aligned with that user frame.  A row of
        ``forced`` (a frame, not None) replaces that session's frame by the
        given one, as a prompt frame does (its text and semantic code are
        this position's input, its acoustic codes the next one's).

        ``caches`` holds the sessions' KV caches as rows in ``sessions``'
        order; each grows by one position."""
        import torch

        lay = self.layout
        k = lay.num_codebooks
        rows = len(sessions)
        if tuple(user.shape) != (rows, k):
            raise ValueError(f"user frames must be [{rows}, {k}] codes, got {list(user.shape)}")
        if rows and (int(user.min()) < 0 or int(user.max()) >= lay.audio_vocab):
            raise ValueError(f"user codes must be in [0, {lay.audio_vocab}): Mimi's codes")
        forced = forced or [None] * rows
        for f in forced:
            if f is not None and len(f.codes) != k:
                raise ValueError(f"a forced frame has {k} codes, got {len(f.codes)}")
        for s in sessions:
            if s.length >= lay.context:
                raise ValueError(
                    f"a session reached the model's context of {lay.context} frames; "
                    "longer sessions are not supported"
                )
        for s, f in zip(sessions, forced, strict=True):
            if f is not None:
                s.text, s.semantic = f.text, f.codes[0]
        user_rows = user.tolist()  # (read once here: each read of a device tensor waits for it)
        user = user.to(self.device, torch.long)
        moshi = torch.tensor(
            [[s.semantic, *s.acoustic] for s in sessions], dtype=torch.long, device=self.device
        )
        theirs = torch.tensor([s.user_acoustic for s in sessions], dtype=torch.long)
        users = torch.cat([user[:, :1], theirs.to(self.device)], dim=1)
        text = torch.tensor([[s.text] for s in sessions], dtype=torch.long, device=self.device)
        embeds = self._embed(text, torch.cat([moshi, users], dim=1)[:, :, None])
        positions = torch.tensor([[s.length] for s in sessions], device=self.device)
        with torch.inference_mode():
            out = self._temporal(
                inputs_embeds=embeds,
                attention_mask=caches.mask().to(self.device),
                position_ids=positions,
                past_key_values=caches.cache,
                use_cache=True,
            )
            hidden = out.last_hidden_state[:, -1]
            nxt = self._choose_text(self._text_head(hidden), sessions)
            codes = self._depth_codes(hidden, nxt, sessions)
        caches.grew()
        # The host's copy, read back once for the whole batch.
        texts, host_codes = nxt.tolist(), codes.tolist()
        frames = []
        for i, (s, f) in enumerate(zip(sessions, forced, strict=True)):
            acoustic = list(f.codes[1:]) if f is not None else host_codes[i][1:]
            frames.append(Frame(s.text, (s.semantic, *acoustic)))
            s.length += 1
            s.text, s.semantic = int(texts[i]), int(host_codes[i][0])
            s.acoustic = acoustic
            s.user_acoustic = user_rows[i][1:]
        return frames

    # -- the model's parts ---------------------------------------------------------

    def _embed(self, text: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """The temporal transformer's input: ``text`` [B, T] and ``codes``
        [B, 2K, T] (Moshi's K then the user's K, delayed), summed in
        generate's order (the audio embeddings, then the text's)."""
        with _no_grad():
            audio = sum(emb(codes[:, i]) for i, emb in enumerate(self._embeddings))
            out: torch.Tensor = audio + self._temporal.embed_tokens(text)
        return out

    def _depth_codes(
        self, hidden: torch.Tensor, text: torch.Tensor, sessions: list[Session]
    ) -> torch.Tensor:
        """The depth decoder's K codes for each row ([B, K]): on the row's
        temporal hidden state, from its text token, one codebook a step (the
        semantic code of the next frame, then the acoustic codes of this
        one), as ``depth_decoder.generate`` runs it."""
        import torch
        from transformers import DynamicCache

        cache = DynamicCache()
        last = hidden[:, None]
        ids = text[:, None]
        codes = []
        with torch.inference_mode():
            for _ in range(self.layout.num_codebooks):
                out = self._depth(
                    input_ids=ids, last_hidden_state=last, past_key_values=cache, use_cache=True
                )
                code = self._choose(out.logits[:, -1], sessions, "audio_temperature", "audio_top_k")
                codes.append(code)
                ids = code[:, None]
        return torch.stack(codes, dim=1)

    def _choose_text(self, logits: torch.Tensor, sessions: list[Session]) -> torch.Tensor:
        return self._choose(logits, sessions, "text_temperature", "text_top_k")

    def _choose(
        self, logits: torch.Tensor, sessions: list[Session], temperature: str, top_k: str
    ) -> torch.Tensor:
        """Greedy rows by argmax (as generate with ``do_sample=False``), the
        others by temperature and top-k from their own generator."""
        import torch

        greedy = torch.argmax(logits, dim=-1)
        if not any(getattr(s.sampling, temperature) > 0 for s in sessions):
            return greedy
        out = greedy.clone()
        for i, s in enumerate(sessions):
            temp = getattr(s.sampling, temperature)
            if temp > 0:
                out[i] = _sample(logits[i], temp, getattr(s.sampling, top_k), s.generator)
        return out


def _delayed(codes: torch.Tensor, initial: int) -> torch.Tensor:
    """``codes`` [K, T] with the acoustic codebooks (1..) one frame late, the
    first position of each taking ``initial`` (transformers' delay pattern)."""

    out = codes.clone()
    out[1:, 1:] = codes[1:, :-1]
    out[1:, 0] = initial
    return out


def _generator(sampling: Sampling, device: Any) -> torch.Generator | None:
    import torch

    if not sampling.samples:
        return None
    return torch.Generator(device=device).manual_seed(sampling.seed)


def _sample(row: torch.Tensor, temperature: float, top_k: int, generator: Any) -> torch.Tensor:
    """One draw from ``row``: temperature, top-k, then a multinomial draw."""
    import torch

    scores = row.float() / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)[0]


def _no_grad() -> Any:
    import torch

    return torch.inference_mode()
