"""Speech and image parameters (issue #18) over scripted workers: what is
honoured is recorded in the log and replays to the same bytes; what a
stage cannot honour is a 400 naming the parameter (and the stage), with
nothing admitted.  Real engines: test_engines_image.py, test_engines_tts.py."""

from __future__ import annotations

import base64
import io
import json

import openai
import pytest
from aiohttp.test_utils import make_mocked_request
from PIL import Image

from omnix.events.options import ImageOptions, SpeechOptions
from omnix.events.types import (
    Admitted,
    BlobRef,
    Chunk,
    Finished,
    RequestSpec,
    StageFinished,
    StageParams,
)
from omnix.http.audio.protocol import SpeechRequest
from omnix.http.audio.speech import speech_plan
from omnix.http.common.plan import PlanContext
from omnix.http.core.body import files_url as _files_url
from omnix.http.core.errors import ApiError
from omnix.http.images.plan import image_plan
from omnix.http.images.protocol import ImageRequest
from omnix.http.render import render_response
from omnix.pipelines.validate import parse_pipeline

from .conftest import parse_sse
from .test_errors import assert_error

pytestmark = pytest.mark.asyncio(loop_scope="session")

SPEECH = "/v1/audio/speech"
IMAGES = "/v1/images/generations"


def admitted(server, rid: str) -> RequestSpec:
    return next(e for e in server.omni.log.events_for(rid) if isinstance(e, Admitted)).spec


def assert_replays(server, rid: str, status: int, body: bytes) -> None:
    again = render_response(server.omni.log.events_for(rid), server.omni.blobs)
    assert (again.head.status, again.body) == (status, body)


# -- speech -----------------------------------------------------------------------


async def test_speech_stream_true_is_the_sse_stream(omni_server, http):
    req = {"input": "hi", "response_format": "pcm", "stream": True}
    async with http.post(omni_server.url + SPEECH, json=req) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        rid = r.headers["X-Request-Id"]
        raw = await r.read()
    events = [json.loads(f["data"]) for f in parse_sse(raw)]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * (len(events) - 1) + [
        "speech.audio.done"
    ]
    opts = admitted(omni_server, rid).response
    assert isinstance(opts, SpeechOptions) and (opts.stream, opts.stream_format) == (True, "sse")
    assert_replays(omni_server, rid, 200, raw)


async def test_speech_stream_true_with_audio_format_streams_bytes(omni_server, http):
    req = {"input": "hi", "response_format": "pcm", "stream": True, "stream_format": "audio"}
    async with http.post(omni_server.url + SPEECH, json=req) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "audio/pcm"
        assert r.headers.get("Transfer-Encoding") == "chunked"
        rid = r.headers["X-Request-Id"]
        raw = await r.read()
    opts = admitted(omni_server, rid).response
    assert len(raw) > 0 and isinstance(opts, SpeechOptions) and opts.stream_format == "audio"
    assert_replays(omni_server, rid, 200, raw)


async def test_speech_stream_with_the_openai_streaming_response(omni_server):
    client = openai.AsyncOpenAI(base_url=omni_server.url + "/v1", api_key="unused", max_retries=0)
    try:
        async with client.audio.speech.with_streaming_response.create(
            model="http-omni",
            voice="alloy",
            input="hi",
            response_format="pcm",
            extra_body={"stream": True},
        ) as streamed:
            assert streamed.headers["content-type"] == "text/event-stream"
            raw = b"".join([piece async for piece in streamed.iter_bytes()])
        events = [json.loads(f["data"]) for f in parse_sse(raw)]
        pcm = b"".join(
            base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta"
        )
        whole = await client.audio.speech.create(
            model="http-omni", voice="alloy", input="hi", response_format="pcm"
        )
        assert pcm == whole.content and events[-1]["type"] == "speech.audio.done"
    finally:
        await client.close()


async def test_speech_neutral_values_are_accepted(omni_server, http):
    req = {
        "input": "hi",
        "response_format": "wav",
        "speed": 1.0,
        "instructions": "",
        "stream": False,
    }
    async with http.post(omni_server.url + SPEECH, json=req) as r:
        assert r.status == 200, await r.text()
        rid = r.headers["X-Request-Id"]
    assert admitted(omni_server, rid).stage_params["code2wav"] == StageParams(voice="default")


# fmt: off
SPEECH_BAD = [
    ("speed", {"speed": 1.25}, "speed", "unsupported_parameter"),
    ("slow", {"speed": 0.5}, "speed", "unsupported_parameter"),
    ("speed per stage", {"sampling_params_list": {"code2wav": {"speed": 2.0}}}, "speed", "unsupported_parameter"),
    ("instructions", {"instructions": "whisper, slowly"}, "instructions", "unsupported_parameter"),
    ("stream false with a format", {"stream": False, "stream_format": "sse"}, "stream", "invalid_value"),
    ("stream not a bool", {"stream": "yes"}, "stream", "invalid_value"),
    ("speed out of range", {"speed": 5}, "speed", "invalid_value"),
    ("negative prompt on a talker", {"sampling_params_list": {"talker": {"negative_prompt": "x"}}}, "negative_prompt", "unsupported_parameter"),
    ("output format on a decoder", {"sampling_params_list": {"code2wav": {"output_format": "png"}}}, "output_format", "unsupported_parameter"),
]
# fmt: on


@pytest.mark.parametrize(
    ("name", "extra", "param", "code"), SPEECH_BAD, ids=[b[0] for b in SPEECH_BAD]
)
async def test_bad_speech_parameter(omni_server, http, name, extra, param, code):
    before = len(omni_server.omni.log)
    async with http.post(omni_server.url + SPEECH, json={"input": "hi", **extra}) as r:
        assert r.status == 400, await r.text()
        body = await r.json()
    assert_error(body, 400, param, code)
    if code == "unsupported_parameter" and param in ("speed", "instructions"):
        # names the stages that would have had to honour it
        assert "'code2wav' (scripted)" in body["error"]["message"]
    assert len(omni_server.omni.log) == before


# -- images (scripted: not a diffusers stage) -----------------------------------------


async def test_image_neutral_openai_options_are_accepted(image_server, http):
    req = {"prompt": "x", "quality": "auto", "background": "opaque", "seed": 4}
    async with http.post(image_server.url + IMAGES, json=req) as r:
        assert r.status == 200, await r.text()
        rid = r.headers["X-Request-Id"]
        raw = await r.read()
    assert "output_format" not in json.loads(raw)
    assert admitted(image_server, rid).seed == 4
    assert_replays(image_server, rid, 200, raw)
    async with http.post(
        image_server.url + IMAGES, json={"prompt": "x", "quality": "standard", "background": "auto"}
    ) as r:
        assert r.status == 200


# fmt: off
IMAGE_BAD = [
    ("quality tier", {"quality": "high"}, "quality", "unsupported_parameter"),
    ("quality hd", {"quality": "hd"}, "quality", "unsupported_parameter"),
    ("quality unknown", {"quality": "ultra"}, "quality", "invalid_value"),
    ("style", {"style": "vivid"}, "style", "unsupported_parameter"),
    ("style unknown", {"style": "baroque"}, "style", "invalid_value"),
    ("transparent background", {"background": "transparent"}, "background", "unsupported_parameter"),
    ("background unknown", {"background": "green"}, "background", "invalid_value"),
    ("output format unknown", {"output_format": "gif"}, "output_format", "invalid_value"),
    ("output format on a scripted stage", {"output_format": "jpeg"}, "output_format", "unsupported_parameter"),
    ("negative prompt on a scripted stage", {"negative_prompt": "blur"}, "negative_prompt", "unsupported_parameter"),
    ("true cfg on a scripted stage", {"true_cfg_scale": 4.0}, "true_cfg_scale", "unsupported_parameter"),
    ("true cfg out of range", {"true_cfg_scale": -1}, "true_cfg_scale", "invalid_value"),
    ("url from a scripted stage", {"response_format": "url"}, "response_format", "unsupported_value"),
    ("steps zero", {"num_inference_steps": 0}, "num_inference_steps", "invalid_value"),
    ("steps too many", {"num_inference_steps": 1001}, "num_inference_steps", "invalid_value"),
    ("guidance out of range", {"guidance_scale": 101}, "guidance_scale", "invalid_value"),
    ("seed negative", {"seed": -1}, "seed", "invalid_value"),
    ("negative prompt not a string", {"negative_prompt": 3}, "negative_prompt", "invalid_value"),
]
# fmt: on


@pytest.mark.parametrize(
    ("name", "extra", "param", "code"), IMAGE_BAD, ids=[b[0] for b in IMAGE_BAD]
)
async def test_bad_image_parameter(image_server, http, name, extra, param, code):
    before = len(image_server.omni.log)
    async with http.post(image_server.url + IMAGES, json={"prompt": "x", **extra}) as r:
        assert r.status == 400, await r.text()
        assert_error(await r.json(), 400, param, code)
    assert len(image_server.omni.log) == before


# -- GET /v1/files/{digest} ------------------------------------------------------------


def png(color: tuple[int, int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), color).save(buf, format="PNG")
    return buf.getvalue()


async def test_files_serves_image_blobs_by_digest(image_server, http):
    data = png((1, 2, 3))
    ref = image_server.omni.blobs.put(data, "image/png")
    async with http.get(f"{image_server.url}/v1/files/{ref.digest}") as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == "image/png"
        assert r.headers["ETag"] == f'"{ref.digest}"'
        assert await r.read() == data
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="JPEG")
    jref = image_server.omni.blobs.put(buf.getvalue(), "image/jpeg")
    async with http.get(f"{image_server.url}/v1/files/{jref.digest}") as r:
        assert r.status == 200 and r.headers["Content-Type"] == "image/jpeg"


@pytest.mark.parametrize(
    "name",
    [
        "0" * 31,
        "0" * 33,
        "A" * 32,
        "g" * 32,
        "..%2F..%2Fetc%2Fpasswd",
        "%2e%2e",
        "ab" * 16 + ".png",
        "ab" * 16 + "%00",
    ],
)
async def test_files_refuses_what_is_not_a_digest(image_server, http, name):
    async with http.get(f"{image_server.url}/v1/files/{name}") as r:
        assert r.status in (400, 404)
        body = await r.json()
    if r.status == 400:
        assert_error(body, 400, "digest", "invalid_value")


async def test_files_unknown_or_not_an_image_is_404(image_server, http):
    async with http.get(f"{image_server.url}/v1/files/{'0' * 32}") as r:
        assert r.status == 404
        assert_error(await r.json(), 404, "digest", "file_not_found")
    raw = image_server.omni.blobs.put(b"\x00" * 64, "audio/pcm-f32")
    async with http.get(f"{image_server.url}/v1/files/{raw.digest}") as r:
        assert r.status == 404
    data = png((9, 9, 9))
    ref = image_server.omni.blobs.put(data, "image/png")
    image_server.omni.blobs.delete(ref.digest)  # as retention does once released
    async with http.get(f"{image_server.url}/v1/files/{ref.digest}") as r:
        assert r.status == 404


# -- url responses, planned and rendered without an engine --------------------------------

DIFFUSION = """
name = "p-diffusion"
[[stages]]
name = "image"
engine = { kind = "diffusers", model = "/nonexistent/omnix-test-model" }
[outputs]
image = "image"
"""


def served() -> PlanContext:
    return PlanContext(
        parse_pipeline(DIFFUSION), new_request_id=lambda: "req-1", new_seed=lambda: 7
    )


async def test_url_is_absolute_from_the_host():
    ok = make_mocked_request("POST", IMAGES, headers={"Host": "omnix.example:8443"})
    assert _files_url(ok) == "http://omnix.example:8443/v1/files/"
    assert (
        _files_url(make_mocked_request("POST", IMAGES, headers={"Host": "[::1]:80"}))
        == "http://[::1]:80/v1/files/"
    )
    for bad in ("evil.example/x?", "a b", "host:port:1", "@evil", ""):
        assert _files_url(make_mocked_request("POST", IMAGES, headers={"Host": bad})) == ""


async def test_url_needs_a_usable_host():
    with pytest.raises(ApiError) as exc:
        image_plan(ImageRequest(prompt="x", response_format="url"), served(), files_url="")
    assert exc.value.param == "response_format"


async def test_diffusion_params_are_recorded_and_url_renders_from_the_log():
    body = ImageRequest(
        prompt="a cube",
        response_format="url",
        output_format="jpeg",
        negative_prompt="blur",
        true_cfg_scale=3.0,
        num_inference_steps=3,
        seed=9,
    )
    plan = image_plan(body, served(), files_url="https://h.example/v1/files/")
    ((rid, spec),) = plan.specs
    assert spec.stage_params["image"] == StageParams(
        num_inference_steps=3, negative_prompt="blur", true_cfg_scale=3.0, output_format="jpeg"
    )
    assert spec.seed == 9
    assert isinstance(spec.response, ImageOptions)
    assert spec.response.files_url == "https://h.example/v1/files/"
    ref = BlobRef(digest="ab" * 16, nbytes=10, media_type="image/jpeg")
    events = [
        Admitted(pos=0, ts_ns=2_000_000_000, request_id=rid, pipeline="p-diffusion", spec=spec),
        Chunk(pos=1, request_id=rid, stage="image", replica=0, index=0, modality="image", blob=ref),
        StageFinished(pos=2, request_id=rid, stage="image", replica=0, chunks=1),
        Finished(pos=3, request_id=rid, cause=2),
    ]
    from omnix.events.blobs import MemoryBlobStore

    out = render_response(events, MemoryBlobStore())  # by reference: no blob read
    assert json.loads(out.body) == {
        "created": 2,
        "data": [{"url": "https://h.example/v1/files/" + "ab" * 16}],
        "request_ids": [rid],
        "output_format": "jpeg",
    }


async def test_speech_plan_stream_true():
    s = PlanContext(
        parse_pipeline(
            '\nname = "p-tts"\n[[stages]]\nname = "code2wav"\nengine = { kind = "scripted", '
            'output_modality = "audio" }\n[outputs]\naudio = "code2wav"\n'
        ),
        new_request_id=lambda: "req-2",
        new_seed=lambda: 1,
    )
    plan = speech_plan(SpeechRequest(input="hi", stream=True), s)
    opts = plan.specs[0][1].response
    assert plan.stream and isinstance(opts, SpeechOptions) and opts.stream_format == "sse"
    plan = speech_plan(SpeechRequest(input="hi", stream=False), s)
    opts = plan.specs[0][1].response
    assert not plan.stream and isinstance(opts, SpeechOptions) and opts.stream_format == ""


async def test_refusal_rules_of_a_flux_model():
    from omnix.engines.diffusers_model import DiffusionModel, refusal

    schnell = DiffusionModel(pipeline="FluxPipeline", guidance_embeds=False)
    dev = DiffusionModel(pipeline="FluxPipeline", guidance_embeds=True)
    assert refusal(schnell, StageParams(num_inference_steps=4, output_format="webp")) is None
    assert refusal(schnell, StageParams(guidance_scale=3.5))[0] == "guidance_scale"
    assert refusal(dev, StageParams(guidance_scale=3.5)) is None
    assert refusal(dev, StageParams(negative_prompt="x"))[0] == "negative_prompt"
    assert (
        refusal(dev, StageParams(negative_prompt="x", true_cfg_scale=1.0))[0] == "negative_prompt"
    )
    assert refusal(dev, StageParams(true_cfg_scale=4.0))[0] == "true_cfg_scale"
    assert refusal(dev, StageParams(negative_prompt="x", true_cfg_scale=4.0)) is None
    assert refusal(dev, StageParams(output_format="gif"))[0] == "output_format"
    other = DiffusionModel(pipeline="StableDiffusionPipeline")
    assert refusal(other, StageParams(negative_prompt="x", guidance_scale=7.5)) is None
    assert refusal(other, StageParams(true_cfg_scale=4.0))[0] == "true_cfg_scale"
