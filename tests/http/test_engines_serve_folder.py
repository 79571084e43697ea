"""``omnix serve PATH`` on real engines, as a user runs it (a subprocess),
answered by the official ``openai`` client under the served name: the
tiny text model folder with a copy of a real ``vllm serve`` command line
(every engine flag read back from the running engine, and acting: a
prompt past ``--max-model-len`` is a 400), the same model by a Hugging
Face id from a local hub cache, the tiny diffusers folder, and
the tiny Qwen3-Omni folders (the thinker alone, and the whole model
speaking)."""

from __future__ import annotations

import base64
import io
import subprocess
import sys
from pathlib import Path

import aiohttp
import numpy as np
import openai
import pytest
import soundfile as sf
from PIL import Image

from omnix.testing.served import ServeProcess

from .conftest import engines_missing

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(engines_missing() is not None, reason=f"{engines_missing()}"),
    pytest.mark.timeout(900),
]

ROOT = Path(__file__).resolve().parents[2]
START_S = 600  # a vLLM engine on a busy 2-core machine

#: A chat template of the user's own (vLLM's --chat-template): ChatML
#: with a system line the folder's template does not have.
TEMPLATE = """{{ '<|im_start|>system\\nYou answer in one word.<|im_end|>\\n' }}\
{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"""


async def _serve(*argv: str | Path) -> ServeProcess:
    served = await ServeProcess.start(*map(str, argv))
    await served.ready(timeout=START_S)
    return served


def _client(served: ServeProcess, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=served.url + "/v1", api_key=key, max_retries=0, timeout=300)


async def test_a_vllm_serve_command_line_serves_the_folder_unchanged(tiny_models, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    key = "sk-folder"
    # As one would start vLLM itself (`vllm serve` takes every one of these):
    served = await _serve(
        tiny_models.thinker, "--host", "127.0.0.1", "--api-key", key,
        "--served-model-name", "my-model", "my-alias", "--max-model-len", "256",
        "--dtype", "bfloat16", "--seed", "7", "--chat-template", template,
        # the rest of the engine flags, each to a value that is not vLLM's default
        "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1",
        "--gpu-memory-utilization", "0.3", "--enforce-eager", "--no-enable-prefix-caching",
        "--max-num-seqs", "7", "--max-num-batched-tokens", "512", "--trust-remote-code",
        "--kv-cache-memory-bytes", "128M",
    )  # fmt: skip
    client = _client(served, key)
    try:
        assert [m.id for m in (await client.models.list()).data] == ["my-model", "my-alias"]
        user = [{"role": "user", "content": "Say hello to the folder."}]
        for name in ("my-alias", "my-model"):  # each name, and the answer says which
            resp = await client.chat.completions.create(model=name, messages=user, max_tokens=4)
            assert resp.model == name and resp.choices[0].message.content is not None
        # The chat template is the one given: the prompt is what it renders.
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tiny_models.thinker)
        ids = tok.apply_chat_template(
            user, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=True
        )
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert resp.usage is not None and resp.usage.prompt_tokens == len(ids)
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="tiny-text", messages=user)

        # Each value is in vLLM's config, as the running engine reports it.
        async with aiohttp.ClientSession() as http:
            async with http.get(
                served.url + "/engines", headers={"Authorization": f"Bearer {key}"}
            ) as r:
                assert r.status == 200
                (engine,) = (await r.json())["engines"]
        got = engine["settings"]
        assert engine["capacity"] == 7 and engine["engine"] == "vllm"
        assert got["dtype"] == "bfloat16" and got["max_model_len"] == 256 and got["seed"] == 7
        assert got["tensor_parallel_size"] == 1 and got["pipeline_parallel_size"] == 1
        assert got["gpu_memory_utilization"] == 0.3 and got["enforce_eager"] is True
        assert got["enable_prefix_caching"] is False and got["max_num_seqs"] == 7
        assert got["max_num_batched_tokens"] == 512 and got["trust_remote_code"] is True
        assert got["kv_cache_memory_bytes"] == 128 << 20 and got["quantization"] is None
        assert got["served_model_name"] in ("my-model", ["my-model", "my-alias"])

        # And it acts: a prompt past --max-model-len is a 400 before admission.
        long = [{"role": "user", "content": "word " * 300}]
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model="my-model", messages=long)
        assert err.value.code == "context_length_exceeded"
        assert "maximum context length is 256 tokens" in str(err.value)
    finally:
        await client.close()
        await served.close()


@pytest.fixture
def saved_image_pipeline(tiny_models, tmp_path) -> Path:
    """What `omnix pipelines show --model IMAGE` prints, saved as a file."""
    saved = tmp_path / "image.toml"
    saved.write_text(
        subprocess.run(
            [sys.executable, "-m", "omnix.cli", "pipelines", "show", "--model", str(tiny_models.image)],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
        ).stdout
    )  # fmt: skip
    return saved


async def test_the_image_folder_and_its_saved_pipeline(tiny_models, saved_image_pipeline):
    # The folder by path, and the pipeline `pipelines show --model` printed, unchanged.
    saved = saved_image_pipeline
    for argv in ((tiny_models.image, "--served-model-name", "img"), ("--pipeline", saved)):
        served = await _serve(*argv)
        client = _client(served)
        name = "img" if argv[0] == tiny_models.image else "image"
        try:
            resp = await client.images.generate(
                model=name, prompt="a red cube", size="64x64", extra_body={"seed": 3, "steps": 2}
            )
            img = Image.open(io.BytesIO(base64.b64decode(resp.data[0].b64_json)))
            assert img.format == "PNG" and img.size == (64, 64)
        finally:
            await client.close()
            await served.close()


async def test_a_hugging_face_id_is_served_from_the_local_hub_cache(
    tiny_models, tmp_path, monkeypatch
):
    # As `vllm serve ORG/NAME` offline: the id's snapshot in the hub cache, served under the id.
    from tests.hf_layout import hub_cache

    hub_cache(tmp_path / "hub", "tiny-org/thinker", tiny_models.thinker)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    served = await _serve("tiny-org/thinker", "--max-model-len", "256")
    client = _client(served)
    try:
        (card,) = (await client.models.list()).data
        assert card.id == "tiny-org/thinker" and card.model_extra["stages"] == ["llm"]
        resp = await client.chat.completions.create(
            model="tiny-org/thinker",
            messages=[{"role": "user", "content": "Hello from the hub cache."}],
            max_tokens=4,
        )
        assert resp.model == "tiny-org/thinker" and resp.choices[0].message.content
    finally:
        await client.close()
        await served.close()


async def test_the_qwen3_omni_thinker_folder_answers_text(tiny_models):
    served = await _serve(tiny_models.omni_thinker, "--kv-cache-memory-bytes", "128M")
    client = _client(served)
    try:
        (card,) = (await client.models.list()).data
        assert card.id == "omni_thinker" and card.model_extra["stages"] == ["thinker"]
        resp = await client.chat.completions.create(
            model="omni_thinker",
            messages=[{"role": "user", "content": "Hello there."}],
            max_tokens=8,
            seed=1,
        )
        # A thinker-only Qwen3-Omni folder is the Thinking checkpoint: its
        # default reasoning parser (qwen3) reads the answer as reasoning until
        # a </think> that random weights never write.
        message = resp.choices[0].message
        assert resp.model == "omni_thinker" and message.reasoning_content and not message.content
        assert resp.usage is not None and 0 < resp.usage.completion_tokens <= 8
        # a checkpoint that does not speak: audio asked of it is a 400 saying what to do
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(
                model="omni_thinker",
                messages=[{"role": "user", "content": "Hello there."}],
                modalities=["text", "audio"],
                audio={"voice": "default", "format": "wav"},
                max_tokens=8,
            )
        assert "cannot produce 'audio' output (it produces: text): ask for text only" in (
            err.value.message
        )
    finally:
        await client.close()
        await served.close()


async def test_the_whole_qwen3_omni_folder_speaks(tiny_models):
    served = await _serve(tiny_models.omni, "--served-model-name", "omni-speaks")
    client = _client(served)
    try:
        (card,) = (await client.models.list()).data
        assert card.model_extra["stages"] == ["thinker", "talker", "code2wav"]
        resp = await client.chat.completions.create(
            model="omni-speaks",
            messages=[{"role": "user", "content": "Say something."}],
            modalities=["text", "audio"],
            audio={"voice": "default", "format": "wav"},
            seed=2,
            # the random-weight talker never ends by itself: bound its frames
            extra_body={"sampling_params_list": [{"max_tokens": 8}, {"max_tokens": 12}, None]},
        )
        msg = resp.choices[0].message
        assert msg.audio is not None and msg.audio.transcript == msg.content
        pcm, rate = sf.read(io.BytesIO(base64.b64decode(msg.audio.data)))
        assert rate == 24000 and len(pcm) > 0 and np.isfinite(pcm).all()
    finally:
        await client.close()
        await served.close()
