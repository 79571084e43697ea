"""``POST /v1/audio/speech/batch`` on a served Qwen3-TTS CustomVoice folder
(``omnix serve PATH``, real workers): items with their own voice,
instructions, language and format, admitted together as separate
requests, each answered with the very file its body gets from
``/v1/audio/speech`` alone (greedy); a bad item is one 400 naming its
index, with nothing admitted; more items than ``--max-batch``, a 400
naming ``items``."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping

import aiohttp
import pytest

from omnix.testing.served import ServeProcess

from .conftest import engines_missing
from .tts_serving import GREEDY, assert_heard, expected_pcm, serve

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(engines_missing() is not None, reason=f"{engines_missing()}"),
    pytest.mark.timeout(900),
]


async def _post(
    http: aiohttp.ClientSession, served: ServeProcess, path: str, body: dict, **headers: str
) -> tuple[int, bytes, Mapping[str, str]]:
    async with http.post(served.url + path, json=body, headers=headers) as r:
        return r.status, await r.read(), r.headers


async def test_a_batch_answers_each_item_as_speech_answers_it_alone(tiny_models):
    folder = tiny_models.qwen3_tts_custom_voice
    served, client = await serve(folder, "tts-custom", "--max-batch", "3")
    items = [
        {"input": "Hello there, how are you today?", "voice": "ryan", "language": "English"},
        {"input": "Speak softly, please.", "instructions": "Very happy, and a little fast."},
        {"input": "The third one.", "voice": "Vivian", "response_format": "wav"},
    ]
    try:
        async with aiohttp.ClientSession() as http:
            batch = {"response_format": "pcm", "voice": "aiden", "items": items, **GREEDY}
            status, raw, headers = await _post(
                http, served, "/v1/audio/speech/batch", batch, **{"X-Request-Id": "b1"}
            )
            assert status == 200, raw
            assert headers["X-Request-Id"] == "b1-0,b1-1,b1-2"
            answer = json.loads(raw)
            assert (answer["id"], answer["total"], answer["succeeded"], answer["failed"]) == (
                "b1", 3, 3, 0
            )  # fmt: skip
            results = answer["results"]
            assert [r["index"] for r in results] == [0, 1, 2]
            assert [r["request_id"] for r in results] == ["b1-0", "b1-1", "b1-2"]
            assert [r["media_type"] for r in results] == ["audio/pcm", "audio/pcm", "audio/wav"]
            assert all(r["status"] == "success" and r["usage"]["output_tokens"] == 23
                       for r in results)  # fmt: skip
            # Each item is the body the batch's fields and its own make, alone.
            for item, result in zip(items, results, strict=True):
                alone = {"voice": "aiden", "response_format": "pcm", **item, **GREEDY}
                status, file, _ = await _post(http, served, "/v1/audio/speech", alone)
                assert status == 200, file
                assert base64.b64decode(result["audio_data"]) == file
            assert_heard(
                base64.b64decode(results[0]["audio_data"]),
                expected_pcm(folder, text=items[0]["input"], speaker="ryan", language="English"),
            )
            # A request of its own: its state and trace, as any speech request's.
            async with http.get(served.url + "/v1/requests/b1-1") as r:
                assert r.status == 200

            # Refused before anything is admitted, naming the item.
            bad = {"items": [items[0], {"input": "Hi.", "voice": "alloy"}]}
            status, raw, _ = await _post(
                http, served, "/v1/audio/speech/batch", bad, **{"X-Request-Id": "b2"}
            )
            assert status == 400, raw
            err = json.loads(raw)["error"]
            assert err["param"] == "items[1].voice" and "items[1]: Unknown voice" in err["message"]
            async with http.get(served.url + "/v1/requests/b2-0") as r:
                assert r.status == 404  # the good item was not admitted either
            refusals = [
                ({"items": [{"input": "Hi.", "ref_audio": "data:,"}]}, "items[0].ref_audio"),
                ({"language": "Klingon", "items": [{"input": "Hi."}]}, "items[0].language"),
                ({"items": [{"input": "Hi."}] * 4}, "items"),
                ({"items": []}, "items"),
                ({"items": [{"input": "Hi.", "stream": True}]}, "items[0].stream"),
            ]
            for body, param in refusals:
                status, raw, _ = await _post(http, served, "/v1/audio/speech/batch", body)
                assert status == 400, raw
                assert json.loads(raw)["error"]["param"] == param, raw
    finally:
        await client.close()
        await served.close()
