"""Image generation on ``tiny-image`` (a diffusers pipeline) through the
official ``openai`` client: PNGs of the requested size."""

from __future__ import annotations

import base64
import io

import openai
from PIL import Image

from .conftest import real_engine_marks

PIPELINE = "tiny-image"
pytestmark = real_engine_marks()


async def test_images_decode_at_the_requested_size(server):
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300
    )
    try:
        resp = await client.images.generate(
            model="tiny-image",
            prompt="a red cube",
            n=2,
            size="64x64",
            response_format="b64_json",
            extra_body={"seed": 5, "steps": 2},
        )
        assert len(resp.data) == 2
        for item in resp.data:
            img = Image.open(io.BytesIO(base64.b64decode(item.b64_json)))
            assert img.format == "PNG" and img.size == (64, 64)
        other = await client.images.generate(
            model="tiny-image", prompt="a red cube", size="32x48", extra_body={"steps": 2}
        )
        img = Image.open(io.BytesIO(base64.b64decode(other.data[0].b64_json)))
        assert img.size == (32, 48)
    finally:
        await client.close()


# -- issue #18: OpenAI's and vLLM-Omni's image parameters on a real FluxPipeline ----------

from omnix.events.types import Admitted, Progress, StageParams  # noqa: E402
from omnix.http.render import render_response  # noqa: E402


def _progress(server, rid: str) -> list[tuple[int, int]]:
    return [(e.step, e.total) for e in server.omni.log.events_for(rid) if isinstance(e, Progress)]


def _replays(server, rids: list[str], body: bytes) -> None:
    events = [e for rid in rids for e in server.omni.log.events_for(rid)]
    assert render_response(events, server.omni.blobs).body == body


async def test_image_parameters_are_honoured(server, http):
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300
    )
    try:
        # num_inference_steps: one Progress per step
        raw = await client.images.with_raw_response.generate(
            model="tiny-image",
            prompt="a red cube",
            size="32x32",
            extra_body={"seed": 21, "num_inference_steps": 3},
        )
        rid = raw.headers["x-request-id"]
        assert _progress(server, rid) == [(1, 3), (2, 3), (3, 3)]
        _replays(server, [rid], raw.content)
        png = base64.b64decode(raw.parse().data[0].b64_json)

        # seed: the same seed reproduces the bytes, another one does not
        again = await client.images.generate(
            model="tiny-image",
            prompt="a red cube",
            size="32x32",
            quality="auto",
            extra_body={"seed": 21, "num_inference_steps": 3, "background": "opaque"},
        )
        assert base64.b64decode(again.data[0].b64_json) == png
        other = await client.images.generate(
            model="tiny-image",
            prompt="a red cube",
            size="32x32",
            extra_body={"seed": 22, "num_inference_steps": 3},
        )
        assert base64.b64decode(other.data[0].b64_json) != png

        # output_format: JPEG and WebP files, said in the response
        for fmt, pil in (("jpeg", "JPEG"), ("webp", "WEBP"), ("png", "PNG")):
            r = await client.images.generate(
                model="tiny-image",
                prompt="a red cube",
                size="32x32",
                output_format=fmt,
                extra_body={"seed": 21, "num_inference_steps": 3},
            )
            img = Image.open(io.BytesIO(base64.b64decode(r.data[0].b64_json)))
            assert img.format == pil and img.size == (32, 32) and r.output_format == fmt

        # negative_prompt with true CFG changes the image (and is recorded)
        neg = await client.images.with_raw_response.generate(
            model="tiny-image",
            prompt="a red cube",
            size="32x32",
            extra_body={
                "seed": 21,
                "num_inference_steps": 3,
                "negative_prompt": "blurry",
                "true_cfg_scale": 4.0,
            },
        )
        nrid = neg.headers["x-request-id"]
        spec = next(e for e in server.omni.log.events_for(nrid) if isinstance(e, Admitted)).spec
        assert spec.stage_params["image"] == StageParams(
            num_inference_steps=3, width=32, height=32, negative_prompt="blurry", true_cfg_scale=4.0
        )
        assert base64.b64decode(neg.parse().data[0].b64_json) != png
        _replays(server, [nrid], neg.content)
    finally:
        await client.close()


async def test_image_url_downloads_the_same_bytes(server, http):
    client = openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300
    )
    try:
        b64 = await client.images.generate(
            model="tiny-image",
            prompt="a blue ball",
            size="32x32",
            n=2,
            extra_body={"seed": 40, "num_inference_steps": 2},
        )
        raw = await client.images.with_raw_response.generate(
            model="tiny-image",
            prompt="a blue ball",
            size="32x32",
            n=2,
            response_format="url",
            extra_body={"seed": 40, "num_inference_steps": 2},
        )
        urls = raw.parse()
    finally:
        await client.close()
    host = server.url.split("://", 1)[1]
    for item, whole in zip(urls.data, b64.data, strict=True):
        assert item.b64_json is None and item.url.startswith(f"http://{host}/v1/files/")
        async with http.get(item.url) as r:
            assert r.status == 200 and r.headers["Content-Type"] == "image/png"
            assert await r.read() == base64.b64decode(whole.b64_json)
    _replays(server, raw.headers["x-request-id"].split(","), raw.content)


# fmt: off
REFUSED = [
    ({"guidance_scale": 3.5}, "guidance_scale"),  # the tiny Flux has no guidance embedding
    ({"negative_prompt": "blurry"}, "negative_prompt"),  # needs true_cfg_scale > 1
    ({"negative_prompt": "blurry", "true_cfg_scale": 1.0}, "negative_prompt"),
    ({"true_cfg_scale": 4.0}, "true_cfg_scale"),  # needs a negative prompt
    ({"background": "transparent"}, "background"),
    ({"style": "natural"}, "style"),
    ({"quality": "high"}, "quality"),
    ({"sampling_params_list": {"image": {"output_format": "bmp"}}}, "output_format"),
]
# fmt: on


async def test_image_parameters_the_pipeline_cannot_honour(server, http):
    for extra, param in REFUSED:
        before = len(server.omni.log)
        async with http.post(
            server.url + "/v1/images/generations", json={"prompt": "x", **extra}
        ) as r:
            assert r.status == 400, (extra, await r.text())
            err = (await r.json())["error"]
        assert err["param"] == param and err["code"] == "unsupported_parameter", err
        assert len(server.omni.log) == before
