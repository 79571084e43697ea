"""``POST /v1/images/edits`` on ``tiny-image`` (a real diffusers Flux
pipeline) through the official ``openai`` client: image-to-image, inpaint
with the pixels outside OpenAI's mask (alpha 0 = repaint) kept as sent,
``url`` answers, streamed partial images, every bad form a 400 naming the
field with nothing admitted, and the bytes replayed from the log; then a
stage whose edits are Flux Kontext's reference-image edits."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from PIL import Image

from omnix.events.types import Admitted, Progress
from omnix.http.render import render_response, render_stream

from .conftest import parse_sse, real_engine_marks

PIPELINE = "tiny-image"
pytestmark = real_engine_marks()


def _png(rgb: np.ndarray, alpha: np.ndarray | None = None) -> bytes:
    img = Image.fromarray(rgb, "RGB")
    if alpha is not None:
        img.putalpha(Image.fromarray(alpha, "L"))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _picture(w: int, h: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _decoded(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def _client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300
    )


def _events(server, rid: str):
    return list(server.omni.log.events_for(rid))


async def test_image_to_image_at_the_images_size_seeded_and_replayed(server):
    src = _picture(40, 56, seed=1)
    client = _client(server)
    try:
        raw = await client.images.with_raw_response.edit(
            model="tiny-image",
            image=("photo.png", _png(src), "image/png"),
            prompt="make it red",
            extra_body={"seed": 7, "num_inference_steps": 4, "strength": 0.5},
        )
        rid = raw.headers["x-request-id"]
        resp = raw.parse()
        out = _decoded(resp.data[0].b64_json)
        assert out.shape == (56, 40, 3)  # size auto: the image's
        assert resp.size == "40x56"
        # strength 0.5 of 4 steps: 2 denoising steps ran
        assert [(e.step, e.total) for e in _events(server, rid) if isinstance(e, Progress)] == [
            (1, 2),
            (2, 2),
        ]
        (adm,) = [e for e in _events(server, rid) if isinstance(e, Admitted)]
        assert adm.spec.api == "images.edits"
        (part,) = adm.spec.messages[0].media
        assert part.kind == "image" and part.blob.shape == (56, 40, 3)
        assert np.array_equal(server.omni.blobs.get_array(part.blob), src)
        assert render_response(_events(server, rid), server.omni.blobs).body == raw.content
        again = await client.images.edit(
            image=("photo.png", _png(src), "image/png"),
            prompt="make it red",
            extra_body={"seed": 7, "num_inference_steps": 4, "strength": 0.5},
        )
        assert again.data[0].b64_json == resp.data[0].b64_json
        sized = await client.images.edit(
            image=("photo.png", _png(src), "image/png"),
            prompt="make it red",
            size="64x32",
            response_format="url",
            output_format="jpeg",
            extra_body={"num_inference_steps": 2},
        )
        assert sized.data[0].url.startswith(server.url + "/v1/files/")
        assert sized.output_format == "jpeg"
    finally:
        await client.close()


async def test_inpaint_keeps_the_unmasked_pixels_as_sent(server, http):
    src = _picture(48, 48, seed=2)
    alpha = np.full((48, 48), 255, np.uint8)
    alpha[10:30, 12:40] = 0  # OpenAI: alpha 0 is the area to repaint
    client = _client(server)
    try:
        resp = await client.images.edit(
            image=("photo.png", _png(src), "image/png"),
            mask=("mask.png", _png(src, alpha), "image/png"),
            prompt="a cat",
            extra_body={"seed": 3, "num_inference_steps": 3, "strength": 1.0},
        )
    finally:
        await client.close()
    out = _decoded(resp.data[0].b64_json)
    keep = alpha == 255
    assert np.array_equal(out[keep], src[keep])
    assert not np.array_equal(out[~keep], src[~keep])


async def test_streamed_edit_sends_partial_images_then_the_image(server):
    src = _picture(32, 32, seed=4)
    client = _client(server)
    try:
        stream = await client.images.edit(
            image=("photo.png", _png(src), "image/png"),
            prompt="a dog",
            stream=True,
            partial_images=2,
            extra_body={"seed": 5, "num_inference_steps": 6, "strength": 1.0},
        )
        events = [ev async for ev in stream]
        rid = stream.response.headers["x-request-id"]
    finally:
        await client.close()
    kinds = [ev.type for ev in events]
    assert kinds == ["image_edit.partial_image"] * 2 + ["image_edit.completed"]
    assert [ev.partial_image_index for ev in events[:2]] == [0, 1]
    for ev in events:
        assert _decoded(ev.b64_json).shape == (32, 32, 3)
        assert ev.size == "32x32" and ev.output_format == "png"
    previews = [e for e in _events(server, rid) if isinstance(e, Progress) and e.blob]
    assert [e.step for e in previews] == [2, 4]  # two of six steps, spread evenly
    body = b"".join(render_stream(_events(server, rid), server.omni.blobs))
    frames = parse_sse(body)
    assert [f["id"] for f in frames] == [
        str(previews[0].pos),
        str(previews[1].pos),
        frames[2]["id"],
    ]


async def test_streamed_generation_sends_partial_images_too(server):
    client = _client(server)
    try:
        stream = await client.images.generate(
            model="tiny-image",
            prompt="a tree",
            size="32x32",
            stream=True,
            partial_images=1,
            extra_body={"num_inference_steps": 4},
        )
        kinds = [ev.type async for ev in stream]
    finally:
        await client.close()
    assert kinds == ["image_generation.partial_image", "image_generation.completed"]


def _form(files: list[tuple[str, bytes]], **fields: str):
    import aiohttp

    form = aiohttp.FormData(default_to_multipart=True)
    for name, data in files:
        form.add_field(name, data, filename="f.png", content_type="image/png")
    for key, value in {"prompt": "x", **fields}.items():
        form.add_field(key, value)
    return form


_SRC = _png(_picture(32, 32))
_MASK = _png(_picture(32, 32), np.zeros((32, 32), np.uint8))
BAD = [
    # (name, files, fields, param, code, words)
    ("no image", [], {}, "image", "invalid_value", "no image"),
    ("mask only", [("mask", _MASK)], {}, "image", "invalid_value", "no image"),
    ("not an image", [("image", b"not a picture" * 8)], {}, "image", "invalid_media", "PNG"),
    (
        "two images",
        [("image[]", _SRC), ("image[]", _SRC)],
        {},
        "image",
        "too_many_media_parts",
        "at most 1",
    ),
    (
        "mask size",
        [("image", _SRC), ("mask", _png(_picture(16, 32), np.zeros((32, 16), np.uint8)))],
        {},
        "mask",
        "invalid_value",
        "16x32",
    ),
    ("mask no alpha", [("image", _SRC), ("mask", _SRC)], {}, "mask", "invalid_media", "alpha"),
    ("too big", [("image", b"\x89PNG" + bytes(11 * 2**20))], {}, "image", "media_too_large", "MiB"),
    (
        "fidelity",
        [("image", _SRC)],
        {"input_fidelity": "high"},
        "input_fidelity",
        "unsupported_parameter",
        "strength",
    ),
    ("unknown", [("image", _SRC)], {"voice": "x"}, "voice", "unknown_field", "Unknown form field"),
    ("strength", [("image", _SRC)], {"strength": "0"}, "strength", "invalid_value", "form field"),
    ("size", [("image", _SRC)], {"size": "30x30"}, "size", "invalid_value", "multiples of 8"),
    (
        "stream n",
        [("image", _SRC)],
        {"stream": "true", "n": "2"},
        "stream",
        "unsupported_value",
        "n=2",
    ),
    (
        "partials",
        [("image", _SRC)],
        {"partial_images": "2"},
        "partial_images",
        "invalid_value",
        "stream",
    ),
    (
        "transparent",
        [("image", _SRC)],
        {"background": "transparent"},
        "background",
        "unsupported_parameter",
        "alpha",
    ),
]


@pytest.mark.parametrize(
    ("name", "files", "fields", "param", "code", "says"), BAD, ids=[b[0] for b in BAD]
)
async def test_a_bad_form_is_refused_before_admission(
    server, http, name, files, fields, param, code, says
):
    before = len(server.omni.log)
    blobs = set(server.omni.blobs.digests())
    async with http.post(server.url + "/v1/images/edits", data=_form(files, **fields)) as r:
        body = await r.json()
        assert r.status == 400, body
    err = body["error"]
    assert (err["param"], err["code"]) == (param, code), err
    assert says in err["message"], err["message"]
    assert len(server.omni.log) == before
    assert set(server.omni.blobs.digests()) == blobs


KONTEXT = """
name = "kontext-edits"
[[stages]]
name = "image"
engine = { kind = "diffusers", model = "image", edit = "reference" }
media = { image = true }
[outputs]
image = "image"
"""


async def test_a_reference_edit_stage_runs_kontext(http, tmp_path_factory):
    from omnix.api import Omni
    from omnix.pipelines.validate import parse_pipeline
    from omnix.testing.serving import serve_omni
    from tests.model_fixtures import session_models

    session_models(tmp_path_factory)
    src = _png(_picture(48, 32, seed=8))
    async with serve_omni(Omni(parse_pipeline(KONTEXT)), telemetry=False) as kontext:
        client = _client(kontext)
        try:
            resp = await client.images.edit(
                image=("photo.png", src, "image/png"),
                prompt="make it blue",
                extra_body={"num_inference_steps": 2},
            )
        finally:
            await client.close()
        assert _decoded(resp.data[0].b64_json).shape == (32, 48, 3)
        async with http.post(
            kontext.url + "/v1/images/edits", data=_form([("image", src)], strength="0.5")
        ) as r:
            err = (await r.json())["error"]
            assert r.status == 400 and (err["param"], err["code"]) == (
                "strength",
                "unsupported_parameter",
            )
            assert "reference-image" in err["message"]
