"""Run the reference (``qwen-tts``) on a Qwen3-TTS folder, in ITS environment.

Not a test module: tests/engines/test_qwen3_tts.py runs it as a subprocess
with the reference environment's Python (scripts/reference-env.sh builds it;
transformers 4.57.3 there, 5.19 here, so it cannot run in-process).

    python qwen3_tts_reference.py FOLDER CASES.json OUT.json

Loads FOLDER with ``Qwen3TTSModel.from_pretrained``, reports which tensors
of the checkpoint the reference's modules lack or miss, then for each case
calls the reference's own ``generate_custom_voice`` (or, for a VoiceDesign
folder, ``generate_voice_design``) greedy (the talker and its code predictor), capturing the codes its ``generate`` returns on the
way, and writes the codes and the waveform the reference's decoder made of
them.  A case ``{"decode": codes}`` runs the reference's decoder alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _key_diff(module, files: list[Path], prefix: str = "") -> dict[str, list[str]]:
    from safetensors import safe_open

    stored: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            stored |= {k for k in fh.keys() if k.startswith(prefix)}
    have = set(module.state_dict())
    return {"missing": sorted(have - stored), "unexpected": sorted(stored - have)}


def main(folder: str, cases_path: str, out_path: str) -> None:
    import torch
    from qwen_tts import Qwen3TTSModel

    torch.set_num_threads(1)
    root = Path(folder)
    tts = Qwen3TTSModel.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    speech = tts.model.speech_tokenizer.model
    keys = {
        "model": _key_diff(tts.model, sorted(root.glob("*.safetensors"))),
        "speech_tokenizer": _key_diff(speech, [root / "speech_tokenizer" / "model.safetensors"]),
    }
    captured: list = []
    generate = tts.model.generate

    def capture(*args, **kwargs):
        out = generate(*args, **kwargs)
        captured.append(out[0])
        return out

    tts.model.generate = capture
    results = []
    for case in json.loads(Path(cases_path).read_text()):
        if "decode" in case:  # the decoder alone, on given codes
            codes = torch.tensor(case["decode"])
            wavs, rate = tts.model.speech_tokenizer.decode([{"audio_codes": codes}])
            results.append(
                {"codes": case["decode"], "wav": [float(x) for x in wavs[0]], "sample_rate": rate}
            )
            continue
        captured.clear()
        common = {
            "text": case["text"],
            "language": case.get("language", "Auto"),
            "non_streaming_mode": case.get("non_streaming", True),
            "do_sample": False,
            "subtalker_dosample": False,
            "max_new_tokens": case["max_new_tokens"],
        }
        clone = {}
        if tts.model.tts_model_type == "base":
            ref = {
                "ref_audio": case["ref_audio"],
                "ref_text": case.get("ref_text"),
                "x_vector_only_mode": case.get("x_vector_only", False),
            }
            (item,) = tts.create_voice_clone_prompt(**ref)
            clone = {
                "speaker": [float(x) for x in item.ref_spk_embedding.float()],
                "ref_codes": None if item.ref_code is None else item.ref_code.tolist(),
            }
            wavs, rate = tts.generate_voice_clone(**ref, **common)
        elif tts.model.tts_model_type == "voice_design":
            wavs, rate = tts.generate_voice_design(instruct=case.get("instruct") or "", **common)
        else:
            wavs, rate = tts.generate_custom_voice(
                speaker=case["speaker"], instruct=case.get("instruct"), **common
            )
        codes = captured[0][0]
        results.append(
            {
                "codes": codes.tolist(),
                "wav": [float(x) for x in wavs[0]],
                "sample_rate": rate,
                **clone,
            }
        )
    Path(out_path).write_text(json.dumps({"keys": keys, "results": results}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
