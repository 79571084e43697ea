"""``omnix bench speech --device cuda --sizes real``: the speech stages alone
on one device, omnix's engines against transformers' own path.

Owns one run of Qwen3-Omni's talker (with its code predictor) and Code2Wav,
at the published sizes with random weights built in the process
(``--sizes real``, ``omnix.models.qwen3_omni_real``) or the tiny checkpoint
(``--sizes tiny``), greedy, ``--frames`` frames an answer, the thinker's
side given (a synthetic prompt and answer of token ids: no thinker runs).

* transformers: the talker's own ``generate`` (what
  ``Qwen3OmniMoeForConditionalGeneration.generate`` calls after its
  thinker: DynamicCache, its code predictor inside each step), then
  ``code2wav.chunked_decode``, one request (c=1).
* omnix: ``TalkerEngine`` feeding ``Code2WavEngine`` in this process, as a
  worker runs them, at each ``--concurrency`` level; with ``--decode
  graphs`` (the CUDA default) each bucket's captured step and predictor
  frame are also timed alone (CUDA events, ``--steps`` replays).

Figures (``--json``: one object on the last line), medians of ``--runs``
repetitions in the process after one start (and their minimums,
``*_min``): ``talker_ms_per_step`` and ``predictor_ms_per_frame`` by batch
size, ``code2wav_ms_per_frame``, ``first_packet_ms`` (talker input to the
first PCM chunk, c=1), ``rtf`` and ``audio_s_per_s`` by concurrency,
``talker_audio_s_per_s`` (the talker alone, its frames not decoded: what
Code2Wav costs beside it on one device is the difference),
``transformers_ms_per_frame`` and ``transformers_rtf`` (c=1),
``speedup_vs_transformers`` (transformers' ms a frame over omnix's talker
step plus predictor frame at c=1), ``graph_start_s``, ``peak_gpu_gib``,
``card``.

Does not own the engines (``omnix.engines``) nor the whole pipeline's bench
with the thinker on vLLM (``speech.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

import msgspec

from omnix.bench.loop import run_on_loop
from omnix.bench.report import progress
from omnix.usage import UsageError, counts

#: The c levels the issue asks for.
DEFAULT_LEVELS = (1, 4, 8, 16, 32)
SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920  # 80 ms a frame


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--levels",
        default=",".join(map(str, DEFAULT_LEVELS)),
        help="concurrency levels for the stage bench (default 1,4,8,16,32)",
    )
    parser.add_argument(
        "--frames", type=int, default=159, help="frames an answer, 80 ms each (default 159)"
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="repetitions after one start (default 3)"
    )
    parser.add_argument(
        "--decode",
        choices=("auto", "eager", "static", "graphs"),
        default="auto",
        help="the talker's decode mode (default auto: graphs on CUDA)",
    )
    parser.add_argument(
        "--no-compile", action="store_true", help="capture graphs without torch.compile"
    )
    parser.add_argument(
        "--code2wav-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="Code2Wav's dtype (default float32, as the engine runs it by default)",
    )
    parser.add_argument(
        "--buckets",
        default="",
        help="the talker's graph buckets to capture, e.g. 1,16 (default: the engine's, "
        "1,2,4,8,16,32 up to the largest level); fewer start sooner",
    )
    parser.add_argument(
        "--reference-frames",
        type=int,
        default=40,
        help="frames of transformers' own generate to time (default 40)",
    )


def _levels(text: str, flag: str = "--levels") -> tuple[int, ...]:
    try:
        return counts(text, 32, "1,4,8")
    except ValueError as exc:
        raise UsageError(f"{flag} {exc}") from None


class _Built:
    """The modules one run measures."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from omnix.engines.talker_model import TalkerModel

        self.device = args.device
        if args.sizes == "real":
            from omnix.models.qwen3_omni_real import random_speech_modules, real_speech_config

            mods = random_speech_modules(real_speech_config(), args.device, args.dtype, seed=0)
            self.config = mods.config
            self.talker = TalkerModel(mods.config, mods.talker, mods.thinker_embed, mods.eos)
            self.code2wav = mods.code2wav.to(getattr(torch, args.code2wav_dtype))
            self.parameters = mods.parameters()
        else:
            from omnix.engines.code2wav_engine import load_code2wav
            from omnix.models.build import ensure_models
            from omnix.models.paths import resolve_model

            ensure_models(names=("omni",))
            folder = resolve_model("omni")
            self.talker = TalkerModel.load(folder, args.device, args.dtype)
            self.config = self.talker.cfg
            self.code2wav = load_code2wav(folder, args.device, args.code2wav_dtype)
            self.parameters = sum(p.numel() for p in self.talker.talker.parameters())
        # Plain text ids (below every special id) around one user turn and
        # the assistant's opening: what a thinker stage hands the talker.
        gen = torch.Generator().manual_seed(1)
        ids = self.talker.ids
        top = min(20000, ids.im_start, ids.tts_pad, *ids.media)
        words = torch.randint(top // 2, top, (48 + args.frames + 2,), generator=gen).tolist()
        newline = 198 if top > 198 else words[0]  # Qwen's "\n"; any plain id when tiny
        self.prompt = [ids.im_start, ids.user, *words[:48], ids.im_start, ids.assistant, newline]
        self.answer = words[48:]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _transformers(built: _Built, frames: int) -> tuple[float, float]:
    """transformers' talker generate then chunked_decode, one request:
    (ms a frame of the talker with its predictor, RTF)."""
    import torch

    model = built.talker
    cond = model.conditioning(built.prompt, built.answer[0], model.layout.speakers["chelsie"])
    text = model.project_text(torch.tensor(built.answer[1:-1]))
    trailing = torch.cat([text, model.tts_eos[None]])[None]
    kwargs = {
        "max_new_tokens": frames + 1,
        "min_new_tokens": frames + 1,
        "do_sample": False,
        "eos_token_id": model.layout.codec_eos,
        "repetition_penalty": 1.05,
        "suppress_tokens": list(model.layout.suppressed),
        "output_hidden_states": True,
        "return_dict_in_generate": True,
    }
    n = cond.embeds.shape[0]
    with torch.no_grad():
        _sync(built.device)
        start = time.perf_counter()
        out = model.talker.generate(
            inputs_embeds=cond.embeds[None],
            trailing_text_hidden=trailing,
            tts_pad_embed=model.tts_pad[None, None],
            talker_input_ids=cond.input_ids[None].to(model.device),
            attention_mask=torch.ones(1, n, dtype=torch.long, device=model.device),
            **kwargs,
        )
        _sync(built.device)
        talker_s = time.perf_counter() - start
        codes = torch.stack(
            [h[-1] for h in out.hidden_states if h[-1] is not None], dim=1
        ).transpose(1, 2)
        start = time.perf_counter()
        wav = built.code2wav.chunked_decode(
            codes.to(model.device), chunk_size=300, left_context_size=25
        )
        _sync(built.device)
        decode_s = time.perf_counter() - start
    got = codes.shape[-1]
    audio_s = wav.shape[-1] / SAMPLE_RATE
    return talker_s * 1000 / got, (talker_s + decode_s) / audio_s


def graph_timings(graphs: Any, steps: int) -> dict[int, tuple[float, float]]:
    """Each bucket's predictor frame and talker step replayed alone:
    bucket -> (ms a step, ms a frame)."""
    import torch

    out = {}
    for b, (frame, step) in graphs._graphs.items():
        times = []
        for g in (step, frame):
            g.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / steps)
        out[b] = (times[0], times[1])
    graphs._reset_rows()
    return out


def _code2wav_ms(
    built: _Built, batch: int = 1, chunk: int = 25, context: int = 25, reps: int = 10
) -> float:
    """ms a frame of streamed chunks (``chunk`` new frames after ``context``
    frames of context), ``batch`` requests' chunks in one forward as the
    engine batches them: the GPU time a frame of one row costs."""
    import torch

    groups = built.talker.layout.num_code_groups
    codes = torch.randint(0, 2048, (batch, groups, chunk + context), device=built.talker.device)
    with torch.no_grad():
        built.code2wav(codes)
        _sync(built.device)
        start = time.perf_counter()
        for _ in range(reps):
            built.code2wav(codes)
        _sync(built.device)
    return (time.perf_counter() - start) * 1000 / reps / chunk / batch


async def _speak(
    talker: Any, code2wav: Any | None, built: _Built, rid: str, frames: int
) -> dict[str, float]:
    from omnix.events.types import StageParams
    from omnix.transport.work import GenerateRequest, InputPiece

    params = StageParams(temperature=0.0, max_tokens=frames + 1, voice="chelsie")

    async def talker_inputs():
        yield InputPiece(modality="hidden", token_ids=tuple(built.prompt), text="{}")
        yield InputPiece(token_ids=tuple(built.answer))

    async def codes():
        req = GenerateRequest(request_id=rid, stage="talker", params=params)
        async for out in talker.generate(req, talker_inputs()):
            if out.token_ids:
                yield InputPiece(modality="codec", token_ids=out.token_ids)

    start = time.perf_counter()
    first, samples = 0.0, 0
    if code2wav is None:  # the talker alone: its frames counted as audio
        async for piece in codes():
            first = first or time.perf_counter() - start
            samples += len(piece.token_ids) // built.talker.layout.num_code_groups * FRAME_SAMPLES
        return {"first": first, "wall": time.perf_counter() - start, "audio": samples / SAMPLE_RATE}
    req = GenerateRequest(request_id=rid, stage="code2wav", params=StageParams())
    async for out in code2wav.generate(req, codes()):
        if out.array is not None and out.array.size:
            first = first or time.perf_counter() - start
            samples += out.array.size
    wall = time.perf_counter() - start
    return {"first": first, "wall": wall, "audio": samples / SAMPLE_RATE}


async def _omnix(
    built: _Built, args: argparse.Namespace, levels: tuple[int, ...]
) -> dict[str, Any]:
    from omnix.engines.code2wav_engine import Code2WavEngine
    from omnix.engines.talker_engine import TalkerEngine
    from omnix.pipelines.config import Code2WavArgs, TalkerArgs

    targs = TalkerArgs(
        model=f"random-{args.sizes}",
        device=args.device,
        dtype=args.dtype,
        max_batch=levels[-1],
        decode=args.decode,
        compile=not args.no_compile,
    )
    if args.buckets:
        targs = msgspec.structs.replace(targs, graph_buckets=_levels(args.buckets, "--buckets"))
    talker = TalkerEngine(targs, model=built.talker)
    code2wav = Code2WavEngine(
        Code2WavArgs(model=f"random-{args.sizes}", dtype=args.code2wav_dtype), model=built.code2wav
    )
    start = time.perf_counter()
    await talker.start()
    await code2wav.start()
    res: dict[str, Any] = {"graph_start_s": round(time.perf_counter() - start, 1)}
    progress("engines started", start)
    try:
        await _speak(talker, code2wav, built, "warm", 60)  # every chunk shape
        runs: list[dict[str, Any]] = []
        for r in range(args.runs):
            one: dict[str, Any] = {
                "rtf": {}, "audio_s_per_s": {}, "talker_audio_s_per_s": {}, "first": 0.0
            }  # fmt: skip
            for c in levels:
                t0 = time.perf_counter()
                alone = await asyncio.gather(
                    *(_speak(talker, None, built, f"r{r}c{c}t{i}", args.frames) for i in range(c))
                )
                wall = time.perf_counter() - t0
                one["talker_audio_s_per_s"][c] = sum(g["audio"] for g in alone) / wall
                t0 = time.perf_counter()
                got = await asyncio.gather(
                    *(
                        _speak(talker, code2wav, built, f"r{r}c{c}n{i}", args.frames)
                        for i in range(c)
                    )
                )
                wall = time.perf_counter() - t0
                one["rtf"][c] = statistics.median(g["wall"] / g["audio"] for g in got)
                one["audio_s_per_s"][c] = sum(g["audio"] for g in got) / wall
                if c == 1:
                    one["first"] = got[0]["first"]
                print(
                    f"run {r + 1}/{args.runs} c={c}: RTF {one['rtf'][c]:.3f}, "
                    f"{one['audio_s_per_s'][c]:.1f} audio s/s "
                    f"(the talker alone {one['talker_audio_s_per_s'][c]:.1f})",
                    file=sys.stderr,
                    flush=True,
                )
            if talker._graphs is not None and talker._graphs.capture:
                one["graphs"] = await asyncio.get_running_loop().run_in_executor(
                    talker._pool, graph_timings, talker._graphs, 50
                )
            runs.append(one)
        res["runs"] = runs
        return res
    finally:
        await code2wav.close()
        await talker.close()


def stage_summary(
    runs: list[dict[str, Any]], levels: tuple[int, ...], first: str = "first_packet_ms"
) -> dict[str, Any]:
    """The medians (and ``*_min``) of the runs of a talker feeding its
    decoder: ``rtf``, ``audio_s_per_s`` and ``talker_audio_s_per_s`` by
    level, the c=1 request's first audio as ``first`` (in ms, where every
    run timed one), each graph bucket's step and frame."""
    med, low = statistics.median, min
    out: dict[str, Any] = {}
    for key in ("rtf", "audio_s_per_s", "talker_audio_s_per_s"):
        out[key] = {c: round(med(r[key][c] for r in runs), 3) for c in levels}
        out[f"{key}_min"] = {c: round(low(r[key][c] for r in runs), 3) for c in levels}
    if all("first" in r for r in runs):
        out[first] = round(med(r["first"] for r in runs) * 1000, 1)
        out[f"{first}_min"] = round(low(r["first"] for r in runs) * 1000, 1)
    if "graphs" in runs[0]:
        buckets = sorted(runs[0]["graphs"])
        for i, key in enumerate(("talker_ms_per_step", "predictor_ms_per_frame")):
            out[key] = {b: round(med(r["graphs"][b][i] for r in runs), 3) for b in buckets}
            out[f"{key}_min"] = {b: round(low(r["graphs"][b][i] for r in runs), 3) for b in buckets}
    return out


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    levels = _levels(args.levels)
    t0 = time.perf_counter()
    progress(f"building the {args.sizes} sizes on {args.device}", t0)
    built = await asyncio.to_thread(_Built, args)
    progress(f"transformers' own path, {args.reference_frames} frames", t0)
    ref_ms, ref_rtf = await asyncio.to_thread(_transformers, built, args.reference_frames)
    progress("Code2Wav alone", t0)
    res: dict[str, Any] = {
        "card": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "sizes": args.sizes,
        "dtype": args.dtype,
        "decode": args.decode,
        "compile": not args.no_compile,
        "code2wav_dtype": args.code2wav_dtype,
        "frames": args.frames,
        "parameters": built.parameters,
        "transformers_ms_per_frame": round(ref_ms, 2),
        "transformers_rtf": round(ref_rtf, 3),
        "code2wav_ms_per_frame": round(await asyncio.to_thread(_code2wav_ms, built), 3),
        "code2wav_ms_per_frame_batch16": round(await asyncio.to_thread(_code2wav_ms, built, 16), 3),
    }
    progress(f"omnix's engines (decode {args.decode}, compile {not args.no_compile})", t0)
    ours = await _omnix(built, args, levels)
    res["graph_start_s"] = ours["graph_start_s"]
    res |= stage_summary(ours["runs"], levels)
    if "talker_ms_per_step" in res and levels[0] == 1:
        # transformers' path decodes one request: compared with omnix at c=1 only.
        one = res["talker_ms_per_step"][1] + res["predictor_ms_per_frame"][1]
        res["speedup_vs_transformers"] = round(ref_ms / one, 2)
    if args.device.startswith("cuda"):
        res["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return res


def run(args: argparse.Namespace) -> int:
    import json

    if args.frames < 2 or args.runs < 1 or args.reference_frames < 2:
        raise UsageError("--frames and --reference-frames must be >= 2, --runs >= 1")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {args.device}: torch sees no CUDA GPU here")
    res = run_on_loop(_bench(args))
    if not getattr(args, "json", False):
        print(
            f"{res['card']}: talker {res.get('talker_ms_per_step', {}).get(1, '-')} ms a step, "
            f"predictor {res.get('predictor_ms_per_frame', {}).get(1, '-')} ms a frame, "
            f"RTF {res['rtf']}, audio s/s {res['audio_s_per_s']}; transformers "
            f"{res['transformers_ms_per_frame']} ms a frame"
        )
    print(json.dumps(res))
    return 0
