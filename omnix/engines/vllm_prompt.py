"""A vLLM stage's prompts: input pieces rendered into vLLM's engine inputs.

Owns: ``PromptRenderer``.  An input piece becomes the ids of one prompt by
the stage's ``input_mode`` (``chat``: the tokenizer's chat template, with
the model's own placeholder where each media part stood; ``text``: the
raw text; ``token_ids``: the ids as given), mapped into the model's
vocabulary by its layout (``text_offset``, ``codec_bos``).  A raw piece
(``/v1/completions``) is taken as vLLM's completions take it.  The media
become vLLM's ``multi_modal_data`` (audio as (samples, rate), images as PIL
images), and ``render`` builds the engine input, the processor expanding
each placeholder into its item's tokens.

It also keeps vLLM's sender-side multimodal cache true (``unsent``):
rendering media records the items as sent to the engine core, so a render
that is not going to vLLM must be forgotten, or the next request with the
same items sends only their hashes and fails on a cache miss.

Does not own what a continuation appends (``vllm_resume.py``), sampling
(``vllm_sampling.py``) nor running the request (``vllm_loop.py``).
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any, assert_never

import numpy as np

from omnix.engines.vllm_setup import VocabLayout
from omnix.events.types import ChatMessage
from omnix.pipelines.config import VllmArgs
from omnix.transport.work import InputPiece


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # not JSON (the model wrote it): the template gets it as written


class PromptRenderer:
    """``llm`` is the started ``AsyncLLM`` (its renderer and processor
    cache), ``tokenizer`` the stage's (None: prompts are ids), ``model_cls``
    vLLM's model class when the model takes media (else None)."""

    def __init__(
        self,
        folder: Path | None,
        layout: VocabLayout,
        llm: Any,
        tokenizer: Any,
        model_cls: Any,
        chat_template: str | None = None,
    ) -> None:
        self.folder = folder
        self.layout = layout
        self.llm = llm
        self.tokenizer = tokenizer
        self.model_cls = model_cls
        #: the stage's own template (vLLM's --chat-template), over the tokenizer's
        self.chat_template = chat_template

    def prompt_ids(
        self, piece: InputPiece, args: VllmArgs, tools: list[Any] | None = None
    ) -> list[int]:
        """The piece's text ids (per the stage's ``args.input_mode``; ``tools``:
        the request's, which the chat template renders), mapped into this model's
        vocabulary by its layout: shifted by ``text_offset``, then
        ``codec_bos`` (the talker: text ids live above its codec codes)."""
        ids = self._text_ids(piece, args.input_mode, tools)
        if not ids:
            return []
        lay = self.layout
        if lay.text_vocab and not all(0 <= t < lay.text_vocab for t in ids):
            bad = next(t for t in ids if not 0 <= t < lay.text_vocab)
            raise ValueError(
                f"input token id {bad} is outside the text vocabulary [0, {lay.text_vocab}) "
                f"of {self.folder}: the upstream stage must use the same tokenizer"
            )
        if lay.text_offset:
            ids = [t + lay.text_offset for t in ids]
        if lay.codec_bos >= 0:
            ids.append(lay.codec_bos)
        return ids

    def _text_ids(self, piece: InputPiece, mode: str, tools: list[Any] | None) -> list[int]:
        if piece.raw:
            # A completion prompt, as vLLM's /v1/completions takes it: the
            # ids as given, or the text with the tokenizer's special tokens.
            if piece.token_ids:
                return list(piece.token_ids)
            return self._encode(piece.text, special=True)
        joined = "\n".join(m.content for m in piece.messages)
        if mode == "token_ids":
            if piece.token_ids:
                return list(piece.token_ids)
            return self._encode(piece.text or joined, special=False)
        if piece.media and mode != "chat":
            raise ValueError(
                f"a request with audio or image parts reached a stage whose input_mode is "
                f"{mode!r}: media input needs input_mode 'chat' on a multimodal model"
            )
        if mode == "chat":
            return self._chat_ids(piece, tools)
        # "text": the raw text, as a completion prompt
        if piece.text or joined:
            return self._encode(piece.text or joined, special=True)
        return list(piece.token_ids)

    def _chat_ids(self, piece: InputPiece, tools: list[Any] | None) -> list[int]:
        """The piece's messages (or text) and the request's tools through
        the chat template."""
        if piece.messages:
            messages = [self._message(m) for m in piece.messages]
        elif piece.text:
            messages = [{"role": "user", "content": piece.text}]
        else:
            return list(piece.token_ids)
        tok = self._need_tokenizer("chat")
        if not (self.chat_template or getattr(tok, "chat_template", None)):
            raise ValueError(
                f"input_mode 'chat' but the tokenizer in {self.folder} has no chat template: "
                "use input_mode 'text' or give the stage a chat_template (--chat-template)"
            )
        text = tok.apply_chat_template(
            messages,
            chat_template=self.chat_template,
            tools=tools,
            tokenize=False,
            add_generation_prompt=True,
        )
        return self._encode(text, special=False)

    def _message(self, m: ChatMessage) -> dict[str, Any]:
        """A message as chat templates take it; an assistant's calls with
        their arguments as objects, as vLLM hands them to templates."""
        out: dict[str, Any] = {"role": m.role, "content": self._with_placeholders(m)}
        if m.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _arguments(c.arguments)},
                }
                for c in m.tool_calls
            ]
        if m.tool_call_id:
            out["tool_call_id"] = m.tool_call_id
        return out

    def _with_placeholders(self, m: ChatMessage) -> str:
        """The message's text with each media part's placeholder (the model's
        own, e.g. Qwen3-Omni's ``<|audio_start|><|audio_pad|><|audio_end|>``)
        where the part stood among the text parts."""
        if not m.media:
            return m.content
        text, out, prev, counts = m.content, [], 0, collections.Counter[str]()
        for part in m.media:
            if part.in_video:
                continue  # a video's sound track: the video's placeholder holds it
            counts[part.kind] += 1
            out.append(text[prev : part.at])
            ph = self._placeholder(part.kind, counts[part.kind])
            before = part.at > 0 and text[part.at - 1] != "\n"
            after = part.at < len(text) and text[part.at] != "\n"
            out.append(("\n" if before else "") + ph + ("\n" if after else ""))
            prev = part.at
        out.append(text[prev:])
        return "".join(out)

    def _placeholder(self, kind: str, i: int) -> str:
        if self.model_cls is None:
            raise ValueError(
                f"{self.folder} is not a multimodal model: it cannot take {kind} input"
            )
        ph = self.model_cls.get_placeholder_str(kind, i)
        if not ph:
            raise ValueError(f"{self.folder} has no placeholder for {kind} input")
        return str(ph)

    def media(self, piece: InputPiece) -> dict[str, list[Any]]:
        """vLLM's ``multi_modal_data`` for the piece: audio as (samples,
        rate), images as PIL images (what the HF processors take), videos
        as vLLM's own video loader decodes their files (frames and their
        metadata: ``fps`` frames a second, at most ``frames``); a video's
        sound track as an audio item (``processor_kwargs`` then asks the
        processor to hear it with the video)."""
        from PIL import Image

        kinds = [p for m in piece.messages for p in m.media]
        if len(kinds) != len(piece.media):
            raise ValueError(
                f"{len(piece.media)} media arrays for {len(kinds)} media parts: the input piece is malformed"
            )
        data: dict[str, list[Any]] = {}
        for part, arr in zip(kinds, piece.media, strict=True):
            match part.kind:
                case "audio":
                    data.setdefault("audio", []).append((arr, part.rate))
                case "image":
                    data.setdefault("image", []).append(Image.fromarray(arr, mode="RGB"))
                case "video":
                    data.setdefault("video", []).append(_load_video(arr, part.fps, part.frames))
                case "mask":
                    raise ValueError("a mask reached a vLLM stage: masks are for image edits")
                case "speaker":
                    raise ValueError(
                        "a speaker vector reached a vLLM stage: it is a Qwen3-TTS Base talker's"
                    )
                case _:
                    assert_never(part.kind)
        return data

    @staticmethod
    def processor_kwargs(piece: InputPiece) -> dict[str, Any]:
        """The multimodal processor's options for the piece: Qwen3-Omni's
        ``use_audio_in_video`` when a video comes with its sound track."""
        if any(p.in_video for m in piece.messages for p in m.media):
            return {"use_audio_in_video": True}
        return {}

    async def render(
        self,
        prompt: list[int],
        resumed: list[int],
        media: dict[str, list[Any]] | None,
        processor_kwargs: dict[str, Any] | None = None,
        key: str = "",
        cache_salt: str | None = None,
    ) -> tuple[Any, int]:
        """vLLM's engine input for the piece's prompt followed by its resumed
        ids (already in this model's vocabulary), and the prompt's own length
        as the model sees it (with media, each placeholder expanded into its
        item's tokens, which only the processor knows).  Rendered once per
        sub-request: rendering media records the items in vLLM's sender-side
        processor cache as sent, so a second render of the same items would
        send only their hashes, and the engine core, never having received
        them, ends the request with ``finish_reason "error"`` (a cache miss).
        The multimodal processor (mel features, image patches) runs off this
        loop in the async renderer.  ``cache_salt`` (media only) keeps the
        prompt's blocks apart from vLLM's prefix cache.  A video heard with
        its sound track has its items named by ``key`` (the sub-request's
        id), so vLLM's processor cache never holds one of the pair without
        the other: Qwen3-Omni's processor then processes the video alone
        and refuses it ("Video doesn't have audio track"), as it did for
        the same video sent again under another text."""
        ids = prompt + resumed if resumed else prompt
        renderer = self.llm.renderer
        if media is None:
            (rendered,) = renderer.render_cmpl([{"prompt_token_ids": ids}])
            return rendered, len(prompt)
        request: dict[str, Any] = {"prompt_token_ids": ids, "multi_modal_data": media}
        if processor_kwargs:
            request["mm_processor_kwargs"] = processor_kwargs
        if cache_salt:
            request["cache_salt"] = cache_salt
        if processor_kwargs and processor_kwargs.get("use_audio_in_video"):
            request["multi_modal_uuids"] = {
                kind: [f"{key}/{kind}/{i}" for i in range(len(items))]
                for kind, items in media.items()
            }
        (rendered,) = await renderer.render_cmpl_async([request])
        return rendered, len(rendered["prompt_token_ids"]) - len(ids) + len(prompt)

    def unsent(self, rendered: Any) -> None:
        """Forgets a render that is not going to vLLM: its media items would
        otherwise stay marked as sent in the sender-side processor cache,
        and the next request with the same items would fail on a miss."""
        cache = getattr(self.llm.renderer, "mm_processor_cache", None)
        if cache is None or rendered.get("type") != "multimodal":
            return
        for hashes in rendered["mm_hashes"].values():
            for h in hashes:
                cache.invalidate(h)

    def _need_tokenizer(self, why: str) -> Any:
        if self.tokenizer is None:
            raise ValueError(
                f"{self.folder} has no tokenizer, needed for {why} input: send token_ids, or put "
                "a tokenizer in the model folder (or its text_tokenizer/ subfolder)"
            )
        return self.tokenizer

    def _encode(self, text: str, special: bool) -> list[int]:
        if not text:
            return []
        return list(self._need_tokenizer("text").encode(text, add_special_tokens=special))


def _load_video(file: np.ndarray, fps: float, frames: int) -> Any:
    """A video file (its bytes as uint8) decoded by vLLM's own loader (the
    one its server uses, ``VLLM_VIDEO_LOADER_BACKEND``, OpenCV by default):
    ``fps`` frames a second, at most ``frames``; (frames, metadata)."""
    from vllm import envs
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    loader = VIDEO_LOADER_REGISTRY.load(envs.VLLM_VIDEO_LOADER_BACKEND)
    return loader.load_bytes(file.tobytes(), num_frames=frames or -1, fps=fps if fps > 0 else -1)
