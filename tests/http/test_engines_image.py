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
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    try:
        resp = await client.images.generate(
            model="tiny-image", prompt="a red cube", n=2, size="64x64", response_format="b64_json",
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
