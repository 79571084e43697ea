"""A diffusion call's prompts encoded before it runs, for guidance in one forward.

Owns ``call_guidance``: for a call whose two classifier-free guidance
forwards omnix pairs (``diffusers_cfg.py``), the prompt's and the
negative prompt's embeddings, encoded here with the pipeline's own
``encode_prompt`` and put in the call's keyword arguments in place of
the prompts (the pipeline passes given embeddings to its transformer
unchanged, which the pairing recognises them by):

* Wan (text- and image-to-video): ``encoder_hidden_states``, the negative
  absent without guidance.  Encoded with the text-to-video pipeline (Wan's
  image-to-video module cleans prompts with ftfy, which it imports only
  when installed and then calls regardless) and cast to the transformer's
  dtype, as the pipeline would.
* Flux text-to-image with true CFG (``true_cfg_scale > 1`` and a
  negative prompt): ``encoder_hidden_states`` and ``pooled_projections``.
  Flux's image-to-image, inpaint and Kontext classes run their two
  forwards one after the other.

Does not own pairing the forwards (``diffusers_cfg.py``), which families
batch (``omnix.pipelines.diffusion_cache``), or the call
(``diffusers_engine.py``).
"""

from __future__ import annotations

from typing import Any

from omnix.engines.diffusers_cfg import FLUX_SHARED_ROWS, WAN_SHARED_ROWS, Guidance
from omnix.engines.diffusers_jobs import VIDEO_TASKS


def call_guidance(pipe: Any, base: Any, task: str, kwargs: dict[str, Any]) -> Guidance | None:
    """The call's conditioning when ``pipe`` (running ``task``, over the
    folder's pipeline ``base``) is one whose guidance pairs, its prompts
    replaced by embeddings in ``kwargs``; None for any other call (left
    as it is).  A Wan call without guidance gets its embeddings and no
    ``Guidance``: its one forward a step runs as it comes."""
    if task in VIDEO_TASKS and "prompt_embeds" in pipe._omnix_accepts:
        return _wan(pipe, base, kwargs)
    if task == "text_to_image" and type(pipe).__name__ == "FluxPipeline":
        return _flux(pipe, kwargs)
    return None


def _wan(pipe: Any, base: Any, kwargs: dict[str, Any]) -> Guidance | None:
    guidance = kwargs.get("guidance_scale", pipe._omnix_guidance_default)
    positive, negative = base.encode_prompt(
        prompt=kwargs.pop("prompt"),
        negative_prompt=kwargs.pop("negative_prompt", None),
        do_classifier_free_guidance=guidance is not None and guidance > 1.0,
        max_sequence_length=kwargs.get("max_sequence_length", 512),
        device=base._execution_device,
    )
    denoiser = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
    positive = positive.to(denoiser.dtype)
    kwargs["prompt_embeds"] = positive
    if negative is None:
        return None
    negative = negative.to(denoiser.dtype)
    kwargs["negative_prompt_embeds"] = negative
    return Guidance({"encoder_hidden_states": (positive, negative)}, WAN_SHARED_ROWS)


def _flux(pipe: Any, kwargs: dict[str, Any]) -> Guidance | None:
    scale = kwargs.get("true_cfg_scale")
    if kwargs.get("negative_prompt") is None or scale is None or scale <= 1.0:
        return None
    common = {
        "device": pipe._execution_device,
        "max_sequence_length": kwargs.get("max_sequence_length", 512),
    }
    embeds, pooled, _ = pipe.encode_prompt(prompt=kwargs.pop("prompt"), prompt_2=None, **common)
    negative, negative_pooled, _ = pipe.encode_prompt(
        prompt=kwargs.pop("negative_prompt"), prompt_2=None, **common
    )
    kwargs.update(
        prompt_embeds=embeds,
        pooled_prompt_embeds=pooled,
        negative_prompt_embeds=negative,
        negative_pooled_prompt_embeds=negative_pooled,
    )
    return Guidance(
        {
            "encoder_hidden_states": (embeds, negative),
            "pooled_projections": (pooled, negative_pooled),
        },
        FLUX_SHARED_ROWS,
    )
