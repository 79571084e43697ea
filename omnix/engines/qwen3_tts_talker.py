"""Qwen3-TTS's talker on omnix's talker step function.

Owns: ``Qwen3TTSTalker``, which loads a Qwen3-TTS folder's talker (its
modules: ``omnix.models.qwen3_tts_modules``) and text tokenizer, builds a
request's prefill and trailing text vectors as the reference's
``Qwen3TTSForConditionalGeneration.generate`` builds them (a named speaker's
codec id, a language's, an instruction as a user turn before the
assistant's; the text whole in the prefill, the reference's default, or
one token a frame; for a Base checkpoint's cloned voice, ``VoiceClone``:
the speaker vector in the speaker's place and, with a transcript, the
reference audio's codes and its text before the text to say, ICL), and
runs the decode loop (``generate``) over the prefill, step and code
predictor ``TalkerModel`` already owns for Qwen3-Omni's talker: one talker
engine for both models.

Does not own: the modules' definitions, the speech decoder
(``speech_decoder.py``), turning reference audio into a ``VoiceClone``
(``qwen3_tts_clone.py``), nor scheduling, streaming or serving.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from omnix.engines.talker_model import (
    BatchCache,
    CodecLayout,
    Conditioning,
    Sampling,
    TalkerModel,
)

if TYPE_CHECKING:
    import torch


class VoiceClone(msgspec.Struct, frozen=True, kw_only=True):
    """A voice cloned from reference audio (``qwen3_tts_clone.VoiceCloner``):
    its speaker vector ([hidden]) and, in ICL mode, the audio's codes
    ([frames, 16]) with its transcript; codes None: the vector alone."""

    speaker: Any  # torch.Tensor
    codes: Any = None  # torch.Tensor | None
    text: str | None = None

    def __post_init__(self) -> None:
        if (self.codes is None) != (not self.text):
            raise ValueError("a cloned voice's reference codes and transcript come together")


class SpeechRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What one utterance asks of a Qwen3-TTS talker."""

    text: str
    speaker: str | None = None  # a name of the checkpoint's ``spk_id``
    language: str = "auto"  # "auto" or a name of its ``codec_language_id``
    instruct: str | None = None  # how to say it
    #: The whole text in the prefill (the reference's default); False feeds
    #: it one token a frame, as the reference's streaming-text mode does.
    non_streaming: bool = True
    #: A Base checkpoint's cloned voice (in place of a named speaker).
    clone: VoiceClone | None = None


class Prompt(msgspec.Struct, frozen=True):
    """A request's talker prefill and the text vectors later frames read."""

    prefill: Any  # Conditioning
    trailing: Any  # [t, hidden]: frame k reads row k, then tts_pad
    #: ``trailing`` is the text after the prefill's, then ``tts_eos``: text
    #: said after it goes before that eos (text streamed in).  False where
    #: the whole text is in the prefill (non-streaming, cloning in context).
    open: bool = False


def _layout(talker_cfg: dict[str, Any]) -> CodecLayout:
    vocab = talker_cfg["vocab_size"]
    eos = talker_cfg["codec_eos_token_id"]
    return CodecLayout(
        vocab_size=vocab,
        num_code_groups=talker_cfg["num_code_groups"],
        codec_eos=eos,
        codec_pad=talker_cfg["codec_pad_id"],
        codec_bos=talker_cfg["codec_bos_id"],
        codec_nothink=talker_cfg["codec_nothink_id"],
        codec_think_bos=talker_cfg["codec_think_bos_id"],
        codec_think_eos=talker_cfg["codec_think_eos_id"],
        speakers={k.lower(): int(v) for k, v in sorted((talker_cfg.get("spk_id") or {}).items())},
        suppressed=tuple(i for i in range(vocab - 1024, vocab) if i != eos),
        accept_hidden_layer=-1,  # no thinker
    )


class Qwen3TTSTalker(TalkerModel):
    """The talker of one Qwen3-TTS checkpoint, on one device."""

    #: The reference's ``generate`` passes ``min_new_tokens=2``: the codec's
    #: eos is barred from the first two codes.
    min_new_tokens = 2

    def __init__(self, cfg: dict[str, Any], talker: Any, tokenizer: Any) -> None:
        # Not TalkerModel.__init__: that one reads a Qwen3-Omni config.
        self.cfg = cfg
        self.talker_cfg = cfg["talker_config"]
        self.layout = _layout(self.talker_cfg)
        self.tokenizer = tokenizer
        self.variant = str(cfg.get("tts_model_type", ""))
        self.languages = {
            k.lower(): int(v) for k, v in self.talker_cfg["codec_language_id"].items()
        }
        self.dialects = {
            k.lower(): v for k, v in (self.talker_cfg.get("spk_is_dialect") or {}).items() if v
        }
        specials = (cfg["tts_bos_token_id"], cfg["tts_eos_token_id"], cfg["tts_pad_token_id"])
        self._bind(talker, talker.model.text_embedding, specials)

    @classmethod
    def load(
        cls, folder: str | Path, device: str = "cpu", dtype: str = "float32"
    ) -> Qwen3TTSTalker:
        """Load the talker (every ``talker.*`` tensor, none missing or left
        over) and the text tokenizer of a Qwen3-TTS folder."""
        import torch
        from transformers import Qwen2Tokenizer

        from omnix.engines.checkpoint import load_exact
        from omnix.models.qwen3_tts_modules import TTSTalker, read_config
        from omnix.models.seeds import made_on

        folder = Path(folder)
        cfg = read_config(folder)
        if cfg.get("model_type") != "qwen3_tts":
            raise ValueError(f"{folder} is not a Qwen3-TTS checkpoint ({cfg.get('model_type')})")
        # Made on the device in its dtype: at the published size a float32
        # copy on the host would be 7 GB, and its init takes longer than
        # the load.
        with made_on(device, dtype):
            talker = TTSTalker(cfg["talker_config"])
        talker = load_exact(talker, folder, "talker.", "talker")
        talker = talker.to(device=device, dtype=getattr(torch, dtype))
        # The folders' own class; AutoTokenizer would first try to read
        # config.json's qwen3_tts, a model type transformers does not know.
        tokenizer = Qwen2Tokenizer.from_pretrained(str(folder))
        return cls(cfg, talker, tokenizer)

    # -- the prompt ----------------------------------------------------------------

    def _ids(self, text: str) -> torch.Tensor:
        import torch

        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    def _codec_prefix(self, req: SpeechRequest) -> list[int]:
        """The codec side of the prefill: the think markers (with the
        language's id when one is named, or the speaker's dialect), the
        speaker, pad and bos."""
        t = self.talker_cfg
        speaker = (req.speaker or "").lower()
        if req.clone is not None and (speaker or self.variant != "base"):
            raise ValueError(
                "a cloned voice needs a Base checkpoint and no named voice "
                f"(this one is {self.variant}, voice {req.speaker!r})"
            )
        if speaker and speaker not in self.layout.speakers:
            raise ValueError(
                f"unknown voice {req.speaker!r}; this checkpoint has "
                f"{', '.join(sorted(self.layout.speakers))}"
            )
        language = req.language.lower()
        if language != "auto" and language not in self.languages:
            raise ValueError(
                f"unknown language {req.language!r}; this checkpoint has auto, "
                f"{', '.join(sorted(k for k in self.languages if 'dialect' not in k))}"
            )
        lang_id = None if language == "auto" else self.languages[language]
        if language in ("chinese", "auto") and speaker in self.dialects:
            lang_id = self.languages[self.dialects[speaker]]
        if lang_id is None:
            ids = [t["codec_nothink_id"], t["codec_think_bos_id"], t["codec_think_eos_id"]]
        else:
            ids = [t["codec_think_id"], t["codec_think_bos_id"], lang_id, t["codec_think_eos_id"]]
        if speaker:
            ids.append(self.layout.speakers[speaker])
        return [*ids, t["codec_pad_id"], t["codec_bos_id"]]

    def prompt(self, req: SpeechRequest) -> Prompt:
        """The prefill and trailing text vectors of ``req``, as the reference
        builds them: ``[instruction] <|im_start|>assistant\\n`` projected, the
        codec prefix (a cloned voice's vector before pad and bos) under
        ``tts_pad``... ``tts_bos``, then the text (or, cloning with a
        transcript, ``_icl``)."""
        import torch

        ids = self._ids(f"<|im_start|>assistant\n{req.text}<|im_end|>\n<|im_start|>assistant\n")
        embed = self.talker.get_input_embeddings()
        parts = []
        with torch.no_grad():
            if req.instruct:
                parts.append(
                    self.project_text(self._ids(f"<|im_start|>user\n{req.instruct}<|im_end|>\n"))
                )
            codec = embed(torch.tensor(self._codec_prefix(req), device=self.device))
            if req.clone is not None:
                vector = req.clone.speaker.to(codec)[None]
                codec = torch.cat([codec[:-2], vector, codec[-2:]])
            n = codec.shape[0]
            parts.append(self.project_text(ids[:3]))
            text_side = torch.cat([self.tts_pad.expand(n - 2, -1), self.tts_bos[None]])
            parts.append(text_side + codec[:-1])
            body = ids[3:-5]
            if req.clone is not None and req.clone.codes is not None:
                icl, trailing = self._icl(req, body, codec[-1:])
                parts.append(icl)
            elif req.non_streaming:
                pads = embed(
                    torch.full((len(body) + 1,), self.layout.codec_pad, device=self.device)
                )
                parts.append(torch.cat([self.project_text(body), self.tts_eos[None]]) + pads)
                parts.append((self.tts_pad + codec[-1])[None])
                trailing = self.tts_pad[None]
            else:
                parts.append(self.project_text(ids[3:4]) + codec[-1:])
                trailing = torch.cat([self.project_text(ids[4:-5]), self.tts_eos[None]])
            embeds = torch.cat(parts)
        positions = torch.arange(embeds.shape[0]).expand(3, -1)
        # No token ids (-1): the talker reads only the summed embeddings, and
        # a text-only prompt's three MRoPE rows are its plain positions.
        cond = Conditioning(embeds, torch.full((embeds.shape[0],), -1), positions, 0)
        return Prompt(cond, trailing, open=req.clone is None or req.clone.codes is None)

    def text_after(self, text: str) -> torch.Tensor:
        """The text vectors of ``text`` said after what a prompt already holds
        (``text`` begins with its separator: the two tokenize as the whole
        would, the tokenizer splitting words at the space before them), as
        the prompt's trailing rows would have held it."""
        import torch

        with torch.no_grad():
            return self.project_text(self._ids(text))

    def frame_embeddings(self, codes: torch.Tensor) -> torch.Tensor:
        """[frames, 16] codes -> [frames, hidden]: each frame's 16 codec
        embeddings (the talker's table for the first group, the code
        predictor's for the rest) summed in one reduction, as the
        reference sums a cloned voice's reference codes."""
        import torch

        codes = codes.to(self.device)
        tables = [
            self.talker.get_input_embeddings(),
            *self.talker.code_predictor.model.codec_embedding,
        ]
        return torch.stack([tables[g](codes[:, g]) for g in range(codes.shape[1])], dim=1).sum(1)

    def _icl(
        self, req: SpeechRequest, body: torch.Tensor, bos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cloning with a transcript: the transcript's and the text's tokens
        (then ``tts_eos``) beside codec bos and the reference audio's frames.
        Whole text: all the text over codec pads, then bos and the frames
        over ``tts_pad``.  Text a token a frame: text and frames side by
        side from bos, the text left over trailing (or ``tts_pad`` filling
        out the text when the frames are more)."""
        import torch

        clone = req.clone
        assert clone is not None and clone.codes is not None
        ref = self._ids(f"<|im_start|>assistant\n{clone.text}<|im_end|>\n")[3:-2]
        text = torch.cat([self.project_text(torch.cat([ref, body])), self.tts_eos[None]])
        audio = torch.cat([bos, self.frame_embeddings(clone.codes)])
        if req.non_streaming:
            pad = torch.full((text.shape[0],), self.layout.codec_pad, device=self.device)
            icl = torch.cat([text + self.talker.get_input_embeddings()(pad), audio + self.tts_pad])
            return icl, self.tts_pad[None]
        n = audio.shape[0]
        if text.shape[0] > n:
            return text[:n] + audio, text[n:]
        filled = torch.cat([text, self.tts_pad.expand(n - text.shape[0], -1)])
        return filled + audio, self.tts_pad[None]

    # -- decoding ------------------------------------------------------------------

    def generate(
        self, req: SpeechRequest, max_new_tokens: int = 4096, sampling: Sampling | None = None
    ) -> torch.Tensor:
        """The codes of one utterance, [frames, 16], as the reference's
        ``generate`` returns them: a frame per code the talker chose before
        its eos, at most ``max_new_tokens - 1`` (its last choice is never
        completed into a frame)."""
        import torch

        prompt = self.prompt(req)
        cache, slot, code, hidden = self.prefill(prompt.prefill, sampling or Sampling())
        batch = BatchCache(self.talker.config.text_config)
        batch.add(cache, slot.length)
        frames = []
        for k in range(max_new_tokens - 1):
            if code == self.layout.codec_eos:
                break
            text = prompt.trailing[k] if k < prompt.trailing.shape[0] else self.tts_pad
            frame, nxt, new_hidden = self.step(batch, [slot], [code], hidden[None], text[None])
            frames.append(frame[0])
            code, hidden = nxt[0], new_hidden[0]
        if not frames:
            return torch.zeros(0, self.layout.num_code_groups, dtype=torch.long)
        return torch.stack(frames).cpu()
