"""Qwen3-Omni's talker as a step function over transformers' own modules.

Owns: ``TalkerModel``, which loads the talker (backbone, codec head, text
and hidden projections, code predictor) and the thinker's token embedding
from a Qwen3-Omni checkpoint, and computes exactly what transformers'
``Qwen3OmniMoeForConditionalGeneration.generate`` computes for the speech
path, split so that a serving engine can drive it:

- ``conditioning``: the talker's prefill (the user turns' text projected,
  their audio / image / video positions through the hidden projection, then
  the assistant prefix with the codec specials and the speaker) from the
  thinker's prompt ids, its hidden states at those media positions and the
  first generated text token;
- ``trailing``: the one text vector each later frame reads (the thinker's
  next generated token projected; ``tts_eos`` after the last; ``tts_pad``
  after that);
- ``prefill`` and ``step``: one forward of the backbone over a batch of
  requests (left-padded KV caches), the first code group chosen from the
  codec head's logits with the reference's repetition penalty and
  suppressed ids, and the residual groups from the code predictor.

Does not own: scheduling requests, waiting for text, streaming or
cancellation (``talker_engine.py``), nor the thinker (a vLLM stage).

Every value of the codec layout (ids, speakers, code groups, the hidden
layer the talker reads) comes from the checkpoint's ``config.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: The reference's sampling for the code predictor's residual groups when
#: the talker samples (``prepare_inputs_for_generation`` hard-codes them).
PREDICTOR_TOP_K = 50
PREDICTOR_TOP_P = 0.8


@dataclass(frozen=True)
class CodecLayout:
    """The talker's vocabulary as ``config.json`` declares it."""

    vocab_size: int
    num_code_groups: int
    codec_eos: int
    codec_pad: int
    codec_bos: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    speakers: dict[str, int]
    #: ids the talker must never emit: the top 1024 of its vocabulary but eos
    suppressed: tuple[int, ...]
    accept_hidden_layer: int


@dataclass(frozen=True)
class ThinkerIds:
    """The thinker's special ids the talker's input is built from."""

    im_start: int
    assistant: int
    user: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
    media: tuple[int, ...]  # audio, image and video placeholders
    eos: tuple[int, ...]  # the thinker's end-of-text ids


@dataclass
class MediaInfo:
    """What the talker's 3-D positions need of a prompt's media (the
    reference passes the processor's grids and audio feature lengths)."""

    image_grid_thw: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None
    audio_seqlens: torch.Tensor | None = None
    second_per_grids: torch.Tensor | None = None
    use_audio_in_video: bool = False

    def any(self) -> bool:
        return any(
            t is not None and t.numel() > 0
            for t in (self.image_grid_thw, self.video_grid_thw, self.audio_seqlens)
        )


@dataclass
class Conditioning:
    """One request's talker prefill, as the reference builds it."""

    embeds: torch.Tensor  # [n, hidden]
    input_ids: torch.Tensor  # [n] (the thinker's ids; tts_pad for the assistant part)
    positions: torch.Tensor  # [3, n]
    rope_delta: int  # decode position = sequence position + rope_delta


@dataclass
class Sampling:
    """How a request's codes are chosen: greedy when ``temperature`` is 0."""

    temperature: float = 0.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    #: first-group codes before the codec's end of speech may be chosen
    #: (vLLM's ``min_tokens``: the end is masked until then)
    min_tokens: int = 0
    generator: torch.Generator | None = None


@dataclass
class Slot:
    """One request's decoding state inside a batch."""

    length: int  # tokens in its KV cache
    rope_delta: int
    sampling: Sampling
    generated: list[int] = field(default_factory=list)  # first-group codes so far


def _read_layout(cfg: Any) -> CodecLayout:
    talker = cfg.talker_config
    vocab = talker.text_config.vocab_size
    return CodecLayout(
        vocab_size=vocab,
        num_code_groups=talker.num_code_groups,
        codec_eos=talker.codec_eos_token_id,
        codec_pad=talker.codec_pad_id,
        codec_bos=talker.codec_bos_id,
        codec_nothink=talker.codec_nothink_id,
        codec_think_bos=talker.codec_think_bos_id,
        codec_think_eos=talker.codec_think_eos_id,
        # By codec id: the first is the one a request naming none gets.
        speakers={
            k.lower(): int(v)
            for k, v in sorted((talker.speaker_id or {}).items(), key=lambda kv: kv[1])
        },
        suppressed=tuple(i for i in range(vocab - 1024, vocab) if i != talker.codec_eos_token_id),
        accept_hidden_layer=talker.accept_hidden_layer,
    )


def _read_thinker_ids(cfg: Any, eos: tuple[int, ...]) -> ThinkerIds:
    th = cfg.thinker_config
    return ThinkerIds(
        im_start=cfg.im_start_token_id,
        assistant=cfg.assistant_token_id,
        user=cfg.user_token_id,
        tts_pad=cfg.tts_pad_token_id,
        tts_bos=cfg.tts_bos_token_id,
        tts_eos=cfg.tts_eos_token_id,
        media=(th.audio_token_id, th.image_token_id, th.video_token_id),
        eos=eos,
    )


class TalkerModel:
    """The talker of one Qwen3-Omni checkpoint, on one device."""

    #: first-group codes every request chooses before the end of speech may
    #: be one, whatever its ``Sampling.min_tokens`` (the reference's
    #: ``min_new_tokens``; Qwen3-Omni's passes none)
    min_new_tokens = 0

    def end_held_for(self, sampling: Sampling) -> int:
        """How many first codes a request chooses before its end of speech
        may be one."""
        return max(self.min_new_tokens, sampling.min_tokens)

    def __init__(self, cfg: Any, talker: Any, thinker_embed: Any, eos: tuple[int, ...]) -> None:
        self.cfg = cfg
        self.layout = _read_layout(cfg)
        self.ids = _read_thinker_ids(cfg, eos)
        self._bind(talker, thinker_embed, (self.ids.tts_bos, self.ids.tts_eos, self.ids.tts_pad))

    def _bind(self, talker: Any, text_embed: Any, specials: tuple[int, int, int]) -> None:
        """What decoding needs of a talker module whichever checkpoint it
        came from (Qwen3-TTS's talker binds here too): its device and dtype,
        the projected ``tts_bos`` / ``tts_eos`` / ``tts_pad`` vectors, the
        suppressed ids, the code predictor's backbone and the projection
        into it (Qwen3-TTS's ``small_to_mtp_projection``; none in Qwen3-Omni)."""
        import torch

        self.talker = talker
        self.thinker_embed = text_embed
        self.device = next(talker.parameters()).device
        self.dtype = next(talker.parameters()).dtype
        with torch.no_grad():
            bos, eos_, pad = self.project_text(torch.tensor(specials))
        self.tts_bos, self.tts_eos, self.tts_pad = bos, eos_, pad
        self._suppress = torch.tensor(self.layout.suppressed, device=self.device)
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

        from omnix.engines.code_predictor import PredictorBackbone
        from omnix.engines.talker_backbone import TalkerBackbone

        # Qwen3-TTS's dense backbone decodes by direct calls; Qwen3-Omni's
        # (mixture of experts) by its modules.
        dense = isinstance(talker.model, Qwen3VLTextModel)
        self._decode = TalkerBackbone(talker.model) if dense else None
        predictor = talker.code_predictor
        self._predictor = PredictorBackbone(predictor.model)
        self._to_predictor = getattr(predictor, "small_to_mtp_projection", None)
        # The frame's per-group modules as their weights: a frame calls them
        # 15 times each, and a module call costs more than its arithmetic here.
        self._heads = [(h.weight, h.bias) for h in predictor.lm_head]
        self._group_embeds = [e.weight for e in predictor.model.codec_embedding]
        project = self._to_predictor
        #: a Linear projection's weights (None: the module is called, if any)
        self._project = (
            (project.weight, project.bias) if isinstance(project, torch.nn.Linear) else None
        )

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: str = "float32") -> TalkerModel:
        """Load the talker and the thinker's input embedding from a
        Qwen3-Omni folder (``enable_audio_output`` must be true)."""
        import json

        import torch
        from transformers import AutoConfig
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeTalkerForConditionalGeneration,
        )

        from omnix.engines.checkpoint import fused_experts, tensors_under

        folder = Path(folder)
        cfg = AutoConfig.from_pretrained(str(folder))
        if not getattr(cfg, "enable_audio_output", False):
            raise ValueError(
                f"{folder} has enable_audio_output false: it has no talker to serve; "
                "serve it as a text-only pipeline"
            )
        torch_dtype = getattr(torch, dtype)
        talker = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(
            cfg.talker_config, dtype=torch_dtype, attn_implementation="sdpa"
        )
        weights = tensors_under(folder, "talker.")
        if not weights:
            raise FileNotFoundError(
                f"{folder} holds no talker.* weights: the checkpoint cannot speak; "
                "use a Qwen3-Omni folder with its talker, or ask for text only"
            )
        talker.load_state_dict(fused_experts(weights, talker.state_dict()), strict=True)
        talker.to(device).eval()
        if not hasattr(talker.config, "audio_config"):
            # transformers 5.19's talker rope index reads the audio encoder's
            # window from its own config, which has none, when a prompt has
            # audio beside an image (its generate fails there too): the
            # thinker's is the one that cut the audio into tokens.
            talker.config.audio_config = cfg.thinker_config.audio_config
        weight = tensors_under(folder, "thinker.model.embed_tokens.").get("weight")
        if weight is None:
            raise FileNotFoundError(f"{folder} holds no thinker.model.embed_tokens.weight")
        embed = torch.nn.Embedding.from_pretrained(weight.to(torch_dtype), freeze=True).to(device)
        gen = json.loads((folder / "generation_config.json").read_text())
        eos = gen.get("eos_token_id", cfg.im_end_token_id)
        eos_ids = tuple(eos) if isinstance(eos, list) else (int(eos),)
        return cls(cfg, talker, embed, eos_ids)

    # -- conditioning -------------------------------------------------------

    def project_text(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The thinker's embeddings of ``token_ids`` through the talker's
        text projection: [n] -> [n, hidden]."""
        emb = self.thinker_embed(token_ids.to(self.device))
        out: torch.Tensor = self.talker.text_projection(emb)
        return out

    def speaker_id(self, voice: str) -> int:
        try:
            return self.layout.speakers[voice.lower()]
        except KeyError:
            raise ValueError(
                f"unknown voice {voice!r}; this checkpoint has {', '.join(self.layout.speakers)}"
            ) from None

    def conditioning(
        self,
        prompt_ids: list[int],
        first_text: int | None,
        speaker: int,
        media_hidden: torch.Tensor | None = None,
        grids: MediaInfo | None = None,
    ) -> Conditioning:
        """The talker's prefill for a thinker prompt (``prompt_ids``, with
        its media placeholders expanded) and the first generated text token
        (None when the thinker's answer was one token: the reference then
        has no text position in the prefix).

        ``media_hidden`` holds the thinker's hidden states at layer
        ``accept_hidden_layer`` for the prompt's media placeholder positions
        in order ([m, thinker_hidden]); ``grids`` what the processor measured
        of the media, from which the talker's 3-D positions follow."""
        import torch

        ids = torch.tensor(prompt_ids, dtype=torch.long)
        user = self._user_positions(ids)
        media = torch.isin(ids, torch.tensor(self.ids.media))
        hidden_size = self.talker.config.text_config.hidden_size
        user_embeds = torch.empty(len(user), hidden_size, device=self.device, dtype=self.dtype)
        in_user = media[user]
        with torch.no_grad():
            if bool(in_user.any()):
                if media_hidden is None or media_hidden.shape[0] != int(media.sum()):
                    raise ValueError(
                        f"the prompt has {int(media.sum())} media positions but the thinker sent "
                        f"{0 if media_hidden is None else media_hidden.shape[0]} hidden states"
                    )
                full = torch.zeros(len(ids), hidden_size, device=self.device, dtype=self.dtype)
                full[media] = self.talker.hidden_projection(
                    media_hidden.to(self.device, self.dtype)
                )
                user_embeds[in_user] = full[user][in_user]
            user_embeds[~in_user] = self.project_text(ids[user][~in_user])
            assistant = self._assistant_prefix(ids, first_text, speaker)
        embeds = torch.cat([user_embeds, assistant], dim=0)
        input_ids = torch.cat([ids[user], torch.full((assistant.shape[0],), self.ids.tts_pad)])
        positions, delta = self._positions(input_ids, grids)
        return Conditioning(embeds, input_ids, positions, delta)

    def _positions(self, input_ids: torch.Tensor, grids: MediaInfo | None) -> tuple[Any, int]:
        """The prefill's 3-D positions and the decode offset: sequential
        without media, else the talker's own rope index over its input ids
        (what the reference's generate computes)."""
        import torch

        n = len(input_ids)
        if grids is None or not grids.any():
            return torch.arange(n).expand(3, -1), 0
        positions, deltas = self.talker.get_rope_index(
            input_ids[None],
            grids.image_grid_thw,
            grids.video_grid_thw,
            torch.ones(1, n, dtype=torch.long),
            grids.use_audio_in_video,
            grids.audio_seqlens,
            grids.second_per_grids,
        )
        return positions[:, 0], int(deltas.reshape(-1)[0])

    def _user_positions(self, ids: torch.Tensor) -> torch.Tensor:
        """Positions of the user turns (from each ``<|im_start|>user`` to the
        next turn), as the reference selects them."""
        import torch

        n = len(ids)
        pos = torch.arange(n)
        starts = torch.where(ids == self.ids.im_start, pos, torch.full_like(pos, -1))
        previous = torch.cummax(starts, dim=0).values.clamp_min(0)
        roles = ids[(previous + 1).clamp_max(n - 1)]
        return pos[roles == self.ids.user]

    def _assistant_prefix(
        self, ids: torch.Tensor, first_text: int | None, speaker: int
    ) -> torch.Tensor:
        """The nine assistant positions of the prefill: ``<|im_start|>assistant\\n``
        and the first generated token over the codec's no-think markers,
        the speaker, pad and bos."""
        import torch

        starts = ((ids[:-1] == self.ids.im_start) & (ids[1:] == self.ids.assistant)).nonzero()
        if len(starts) == 0:
            raise ValueError("the thinker prompt has no <|im_start|>assistant turn")
        a = int(starts[-1])
        first = [] if first_text is None else [first_text]
        head = self.project_text(torch.cat([ids[a : a + 3], torch.tensor(first, dtype=torch.long)]))
        text = torch.cat([head[:3], self.tts_pad.expand(4, -1), self.tts_bos[None], head[3:4]])
        lay = self.layout
        codec_ids = [
            lay.codec_nothink,
            lay.codec_think_bos,
            lay.codec_think_eos,
            speaker,
            lay.codec_pad,
            lay.codec_bos,
        ]
        codec = self.talker.get_input_embeddings()(torch.tensor(codec_ids, device=self.device))
        zeros = torch.zeros(3, codec.shape[-1], device=self.device, dtype=self.dtype)
        return text + torch.cat([zeros, codec])

    # -- decoding ----------------------------------------------------------------

    def prefill(
        self, cond: Conditioning, sampling: Sampling
    ) -> tuple[Any, Slot, int, torch.Tensor]:
        """Run the prefill of one request; return its KV cache, its slot,
        its first first-group code and the last hidden state ([hidden])."""
        import torch
        from transformers import DynamicCache

        cache = DynamicCache(config=self.talker.config.text_config)
        n = cond.embeds.shape[0]
        positions = torch.cat([torch.arange(n)[None], cond.positions]).unsqueeze(1)
        with torch.no_grad():
            out = self.talker.model(
                inputs_embeds=cond.embeds[None],
                attention_mask=torch.ones(1, n, dtype=torch.long, device=self.device),
                position_ids=positions.to(self.device),
                past_key_values=cache,
                use_cache=True,
            )
            hidden = out.last_hidden_state[:, -1]
            logits = self.talker.codec_head(hidden)
        slot = Slot(length=n, rope_delta=cond.rope_delta, sampling=sampling)
        code = self._choose(logits, [slot])[0]
        return cache, slot, code, hidden[0]

    def prefill_many(
        self, conds: list[Conditioning], samplings: list[Sampling]
    ) -> list[tuple[Any, Slot, int, torch.Tensor]]:
        """``prefill`` of several requests in one forward: their prompts
        right-padded to the longest (the padding after each prompt, so the
        causal mask keeps every prompt position from seeing it), each
        request's cache its own rows' prompt positions, its code chosen from
        its last prompt position.  One request: ``prefill`` itself."""
        if len(conds) == 1:
            return [self.prefill(conds[0], samplings[0])]
        import torch
        from transformers import DynamicCache

        lengths = [c.embeds.shape[0] for c in conds]
        width = max(lengths)
        first = conds[0].embeds
        embeds = first.new_zeros(len(conds), width, first.shape[1])
        # Rows: the sequence position, then the three MRoPE rows; padding
        # goes on counting (it is never attended to by a prompt position).
        positions = torch.arange(width).expand(4, len(conds), width).clone()
        for i, c in enumerate(conds):
            n = lengths[i]
            embeds[i, :n] = c.embeds
            positions[1:, i, :n] = c.positions
            positions[1:, i, n:] = c.positions[:, -1:] + torch.arange(1, width - n + 1)
        cache = DynamicCache(config=self.talker.config.text_config)
        with torch.no_grad():
            out = self.talker.model(
                inputs_embeds=embeds,
                attention_mask=torch.ones(len(conds), width, dtype=torch.long, device=self.device),
                position_ids=positions.to(self.device),
                past_key_values=cache,
                use_cache=True,
            )
            last = torch.tensor([n - 1 for n in lengths], device=self.device)
            hidden = out.last_hidden_state[torch.arange(len(conds), device=self.device), last]
            logits = self.talker.codec_head(hidden)
        slots = [
            Slot(length=n, rope_delta=c.rope_delta, sampling=s)
            for n, c, s in zip(lengths, conds, samplings, strict=True)
        ]
        codes = self._choose(logits, slots)
        # Full-attention layers only (the talker has no other kind).
        tensors: list[tuple[Any, Any]] = [
            (layer.keys, layer.values)  # type: ignore[union-attr]
            for layer in cache.layers
        ]
        result = []
        for i, n in enumerate(lengths):
            own = DynamicCache(config=self.talker.config.text_config)
            for layer_idx, (k, v) in enumerate(tensors):
                own.update(k[i : i + 1, :, :n], v[i : i + 1, :, :n], layer_idx)
            result.append((own, slots[i], codes[i], hidden[i]))
        return result

    def step(
        self,
        caches: BatchCache,
        slots: list[Slot],
        codes: list[int],
        hidden: torch.Tensor,
        text: torch.Tensor,
    ) -> tuple[torch.Tensor, list[int], torch.Tensor]:
        """One decode step of a batch: each row's frame (its first-group
        code ``codes[i]`` completed by the code predictor on ``hidden[i]``),
        then the backbone on the frame's summed embedding plus ``text[i]``
        (the row's trailing text vector).  Returns the frames ([B, groups]),
        the next first-group codes and the new hidden states."""
        frames, total = self.frame(codes, hidden, [s.sampling for s in slots])
        nxt, new_hidden = self._backbone(caches, slots, total + text.to(self.device, self.dtype))
        return frames, nxt, new_hidden

    def forced_step(
        self, caches: BatchCache, slots: list[Slot], frames: torch.Tensor, text: torch.Tensor
    ) -> tuple[list[int], torch.Tensor]:
        """A decode step whose frames are given ([B, groups]: a continuation
        replaying what the replica it replaces delivered) instead of
        predicted; returns the next first-group codes and hidden states."""

        frames = frames.to(self.device)
        total = self.talker.get_input_embeddings()(frames[:, 0])
        embeddings = self.talker.code_predictor.model.codec_embedding
        for g in range(1, frames.shape[1]):
            total = total + embeddings[g - 1](frames[:, g])
        for s, code in zip(slots, frames[:, 0].tolist(), strict=True):
            if not s.generated or s.generated[-1] != code:
                s.generated[-1:] = [code]
        return self._backbone(caches, slots, total + text.to(self.device, self.dtype))

    def _backbone(
        self, caches: BatchCache, slots: list[Slot], inputs: torch.Tensor
    ) -> tuple[list[int], torch.Tensor]:
        import torch

        pos = torch.tensor([s.length for s in slots], device=self.device)
        delta = torch.tensor([s.rope_delta for s in slots], device=self.device)
        positions = torch.stack([pos, pos + delta, pos + delta, pos + delta])[:, :, None]
        with torch.no_grad():
            if self._decode is not None:
                hidden = self._decode.step(caches.cache, caches.mask(), positions, inputs[:, None])
            else:
                out = self.talker.model(
                    inputs_embeds=inputs[:, None],
                    attention_mask=caches.mask(),
                    position_ids=positions,
                    past_key_values=caches.cache,
                    use_cache=True,
                )
                hidden = out.last_hidden_state[:, -1]
            logits = self.talker.codec_head(hidden)
        for s in slots:
            s.length += 1
        caches.grew()
        return self._choose(logits, slots), hidden

    def frame(self, codes: list[int], hidden: torch.Tensor, samplings: list[Sampling]) -> Any:
        """The residual code groups of a batch of frames: the code predictor
        on each row's last talker hidden state and first-group code.
        Returns ([B, groups] codes, [B, hidden] the summed codec embedding
        that is the next step's input before its text vector)."""
        import torch
        from torch.nn import functional as F

        first = torch.tensor(codes, device=self.device)
        first_embed = self.talker.get_input_embeddings()(first)  # [B, H]
        backbone = self._predictor
        backbone.start()
        inputs = torch.stack([hidden, first_embed], dim=1)  # [B, 2, H]
        total = first_embed.clone()
        out_codes = [first]
        groups = self.layout.num_code_groups
        project, heads, embeds = self._project, self._heads, self._group_embeds
        module = self._to_predictor if project is None else None
        greedy = all(s.temperature <= 0 for s in samplings)
        with torch.inference_mode():
            for g in range(groups - 1):
                if project is not None:
                    inputs = F.linear(inputs, *project)
                elif module is not None:
                    inputs = module(inputs)
                last = backbone.forward(inputs)
                logits = F.linear(last, *heads[g])
                # max's indices are argmax's (the first of equal maxima), at half its cost.
                code = logits.max(-1)[1] if greedy else self._choose_residual(logits, samplings)
                out_codes.append(code)
                embed = F.embedding(code, embeds[g])
                inputs = embed[:, None]
                total = total + embed
        return torch.stack(out_codes, dim=1), total

    def _choose_residual(self, logits: torch.Tensor, samplings: list[Sampling]) -> torch.Tensor:
        import torch

        if all(s.temperature <= 0 for s in samplings):
            return torch.argmax(logits, dim=-1)  # row by row, as below
        rows = []
        for row, s in zip(logits, samplings, strict=True):
            if s.temperature <= 0:
                rows.append(torch.argmax(row))
            else:
                rows.append(_sample(row, s, PREDICTOR_TOP_K, PREDICTOR_TOP_P))
        return torch.stack(rows)

    def _choose(self, logits: torch.Tensor, slots: list[Slot]) -> list[int]:
        """First-group codes from the codec head's logits ([B, vocab]): the
        repetition penalty over each request's earlier codes, the
        suppressed ids (and the end of speech before a request's
        ``min_tokens``), then greedy or sampled."""
        import torch

        logits = logits.clone()
        logits[:, self._suppress] = float("-inf")
        for i, slot in enumerate(slots):
            if len(slot.generated) < self.end_held_for(slot.sampling):
                logits[i, self.layout.codec_eos] = float("-inf")
        # Every row's penalty in one gather and scatter: each penalised
        # logit is multiplied or divided by its row's penalty in float32
        # (what a Python number is against float32 logits, and the opmath
        # of half-precision ones, stored back rounded), as row by row.
        rows: list[int] = []
        cols: list[int] = []
        factors: list[float] = []
        for i, slot in enumerate(slots):
            penalty = slot.sampling.repetition_penalty
            if slot.generated and penalty != 1.0:
                seen = sorted(set(slot.generated))
                rows += [i] * len(seen)
                cols += seen
                factors += [penalty] * len(seen)
        if rows:
            at = (
                torch.tensor(rows, device=logits.device),
                torch.tensor(cols, device=logits.device),
            )
            opmath = torch.promote_types(logits.dtype, torch.float32)
            factor = torch.tensor(factors, dtype=opmath, device=logits.device)
            score = logits[at]
            penalised = torch.where(score < 0, score * factor, score / factor)
            logits[at] = penalised.to(logits.dtype)
        if all(slot.sampling.temperature <= 0 for slot in slots):
            # max's indices are argmax's (the first of equal maxima), at half its cost.
            out: list[int] = logits.max(-1)[1].tolist()
        else:
            out = [
                int(torch.argmax(row))
                if slot.sampling.temperature <= 0
                else int(_sample(row, slot.sampling, slot.sampling.top_k, slot.sampling.top_p))
                for row, slot in zip(logits, slots, strict=True)
            ]
        for slot, code in zip(slots, out, strict=True):
            slot.generated.append(code)
        return out


def _sample(row: torch.Tensor, s: Sampling, top_k: int, top_p: float) -> torch.Tensor:
    """One draw from ``row`` as transformers' sampling does it: temperature,
    top-k, top-p, then a multinomial draw from the request's generator."""
    import torch

    scores = row / max(s.temperature, 1e-5)
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        remove = cum <= (1 - top_p)
        remove[-1] = False
        scores = scores.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    probs = scores.softmax(-1)
    return torch.multinomial(probs, 1, generator=s.generator)[0]


class BatchCache:
    """The talker's KV caches of a decoding batch: one ``DynamicCache`` whose
    rows are left-padded to a common width, and each row's valid length.

    Rows join after their own prefill (``add``) and leave when done
    (``keep``); both rebuild the tensors, which costs one copy of the cache
    per change of membership, not per step."""

    def __init__(self, config: Any) -> None:
        from transformers import DynamicCache

        self.config = config
        self.cache = DynamicCache(config=config)
        self.lengths: list[int] = []

    @property
    def width(self) -> int:
        return int(self.cache.get_seq_length()) if self.lengths else 0

    def _tensors(self) -> list[tuple[Any, Any]]:
        # Full-attention layers only (the talker has no other kind).
        return [(layer.keys, layer.values) for layer in self.cache.layers]  # type: ignore[union-attr]

    def _rebuild(self, tensors: list[tuple[Any, Any]], lengths: list[int]) -> None:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        for i, (k, v) in enumerate(tensors):
            cache.update(k, v, i)
        self.cache, self.lengths = cache, lengths

    def add(self, one: Any, length: int) -> None:
        """Append a request's own (unpadded) cache as the last row."""
        import torch

        theirs = [(layer.keys, layer.values) for layer in one.layers]
        if not self.lengths:
            self._rebuild(theirs, [length])
            return
        width = max(self.width, length)

        def pad(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, 0, width - t.shape[-2], 0))

        merged = [
            (torch.cat([pad(k), pad(k1)]), torch.cat([pad(v), pad(v1)]))
            for (k, v), (k1, v1) in zip(self._tensors(), theirs, strict=True)
        ]
        self._rebuild(merged, [*self.lengths, length])

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order); trim padding no row needs."""
        if not rows:
            self.__init__(self.config)  # type: ignore[misc]
            return
        lengths = [self.lengths[i] for i in rows]
        cut = self.width - max(lengths)
        self._rebuild([(k[rows, :, cut:], v[rows, :, cut:]) for k, v in self._tensors()], lengths)

    def mask(self) -> Any:
        """The 2-D attention mask of the next step: each row's valid tail
        of the cache, and the new position."""
        import torch

        width = self.width
        first = width - torch.tensor(self.lengths)  # each row's first valid position
        return (torch.arange(width + 1) >= first[:, None]).long()

    def grew(self) -> None:
        self.lengths = [n + 1 for n in self.lengths]

    def take(self, row: int) -> tuple[Any, int]:
        """Remove ``row`` and return it as a cache of its own (unpadded)."""
        from transformers import DynamicCache

        length, width = self.lengths[row], self.width
        one = DynamicCache(config=self.config)
        for i, (k, v) in enumerate(self._tensors()):
            one.update(
                k[row : row + 1, :, width - length :], v[row : row + 1, :, width - length :], i
            )
        self.keep([i for i in range(len(self.lengths)) if i != row])
        return one, length
