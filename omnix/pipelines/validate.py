"""Pipeline validation and loading: every config error is found before start.

Owns: ``load_pipeline`` (a built-in name, a TOML/YAML/JSON path or text,
decoded with msgspec into ``PipelineConfig``), ``validate_pipeline`` (graph
and reference checks) and ``PipelineError``.  Each problem gets its own
message naming what is wrong, where, and what would fix it.  Per-request
checks live in ``omnix.pipelines.plan``.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from omnix.pipelines.config import (
    AudioEngineArgs,
    DiffusersArgs,
    DuplexArgs,
    PipelineConfig,
    ReplicaRange,
    ScriptedArgs,
    StageConfig,
    TalkerArgs,
    VllmArgs,
)
from omnix.pipelines.devices import device_problems, parse_devices, replica_width
from omnix.pipelines.diffusion_cache import (
    cache_problems,
    cfg_batch_problem,
    explain_decode_error,
    family_problem,
)
from omnix.pipelines.engines import engine_kinds
from omnix.pipelines.placement import placement_problems

SENTENCE_ENDS = (".", "!", "?", "\n", "。", "！", "？")  # noqa: RUF001 (CJK punctuation)


class PipelineError(ValueError):
    """A pipeline config that cannot run.  ``problems`` lists every issue."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid pipeline config {source}:\n{lines}")


def _decode(text: str | bytes, fmt: str, source: str) -> PipelineConfig:
    try:
        if fmt == "toml":
            return msgspec.toml.decode(text, type=PipelineConfig)
        if fmt in ("yaml", "yml"):
            return msgspec.yaml.decode(text, type=PipelineConfig)
        if fmt == "json":
            return msgspec.json.decode(text, type=PipelineConfig)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        explained = explain_decode_error(msg)
        if explained is not None:
            msg = explained
        elif "Expected `str` of" in msg or ("Invalid value" in msg and "kind" in msg):
            msg += f" (engine kinds: {', '.join(engine_kinds())})"
        raise PipelineError(source, [msg]) from None
    except msgspec.DecodeError as exc:
        raise PipelineError(source, [f"not valid {fmt.upper()}: {exc}"]) from None
    raise PipelineError(source, [f"unknown config format {fmt!r}; use .toml, .yaml or .json"])


def parse_pipeline(text: str | bytes, fmt: str = "toml", source: str = "<text>") -> PipelineConfig:
    cfg = _decode(text, fmt, source)
    validate_pipeline(cfg, source)
    return cfg


def load_pipeline(name_or_path: str | Path) -> PipelineConfig:
    """A built-in pipeline by name (``tiny-omni``), or a config file path."""
    from omnix.pipelines.registry import builtin_names, builtin_path

    p = Path(name_or_path)
    if not p.exists():
        bp = builtin_path(str(name_or_path))
        if bp is None:
            raise PipelineError(
                str(name_or_path),
                [
                    "no such file and no built-in pipeline of that name "
                    f"(built-in: {', '.join(builtin_names())})"
                ],
            )
        p = bp
    fmt = p.suffix.lstrip(".").lower()
    try:
        data = p.read_bytes()
    except OSError as exc:  # a directory, no permission
        raise PipelineError(str(p), [f"cannot read it ({exc.strerror or exc})"]) from None
    return parse_pipeline(data, fmt, str(p))


def validate_pipeline(cfg: PipelineConfig, source: str = "<config>") -> None:
    problems: list[str] = []
    names = [st.name for st in cfg.stages]
    if not names:
        problems.append("no stages: a pipeline needs at least one [[stages]] entry")
    seen: set[str] = set()
    for n in names:
        if n in seen:
            problems.append(f"stage {n!r} is declared twice; stage names must be unique")
        seen.add(n)
        if not n or "/" in n or n == "request":
            problems.append(f"stage name {n!r} is not allowed (non-empty, no '/', not 'request')")
    for st in cfg.stages:
        problems.extend(_replica_problems(st))
        if st.timeout_s <= 0:
            problems.append(f"stage {st.name!r}: timeout_s must be > 0, got {st.timeout_s}")
        if st.max_retries < 0:
            problems.append(
                f"stage {st.name!r}: max_retries must be >= 0, got {st.max_retries} "
                "(0 with retry = true never continues; set retry = false to say so)"
            )
        if st.max_queue < 0:
            problems.append(f"stage {st.name!r}: max_queue must be >= 0, got {st.max_queue}")
        if isinstance(st.engine, DiffusersArgs):
            problems.extend(f"stage {st.name!r}: {p}" for p in _diffusers_problems(st.engine))
        if isinstance(st.engine, TalkerArgs):
            problems.extend(f"stage {st.name!r}: {p}" for p in _talker_problems(st.engine))
        if isinstance(st.engine, DuplexArgs):
            problems.extend(f"stage {st.name!r}: {p}" for p in _duplex_problems(st.engine))
    problems.extend(_edge_problems(cfg, names))
    cycle = _find_cycle(names, cfg)
    if cycle:
        problems.append(f"the edges form a cycle: {' -> '.join(cycle)}; a pipeline must be acyclic")
    if not cfg.outputs:
        problems.append(
            'no [outputs]: say which stage produces each final modality, e.g. text = "thinker"'
        )
    for modality, stage in cfg.outputs.items():
        if stage not in seen:
            problems.append(
                f"outputs.{modality} = {stage!r}: no such stage (stages: {', '.join(names)})"
            )
            continue
        produced = stage_output_modality(cfg, stage)
        if produced is not None and produced != modality:
            problems.append(
                f"outputs.{modality} = {stage!r}, but stage {stage!r} produces {produced}, not {modality}"
            )
    if cfg.abort_timeout_s <= 0:
        problems.append(f"abort_timeout_s must be > 0, got {cfg.abort_timeout_s}")
    problems.extend(_media_problems(cfg))
    problems.extend(_speech_problems(cfg))
    for st in cfg.stages:
        problems.extend(device_problems(st))
        problems.extend(placement_problems(st))
        if isinstance(st.engine, VllmArgs):
            problems.extend(f"stage {st.name!r}: {p}" for p in _vllm_problems(st.engine))
    if problems:
        raise PipelineError(source, problems)


def _edge_problems(cfg: PipelineConfig, names: list[str]) -> list[str]:
    """Edges between unknown stages, loops, duplicates, and fan-in that streams."""
    problems: list[str] = []
    seen = set(names)
    incoming: dict[str, list[str]] = {n: [] for n in names}
    for i, e in enumerate(cfg.edges):
        where = f"edge #{i + 1} ({e.source} -> {e.target})"
        if e.source not in seen:
            problems.append(
                f"{where}: unknown source stage {e.source!r} (stages: {', '.join(names)})"
            )
        if e.target not in seen:
            problems.append(
                f"{where}: unknown target stage {e.target!r} (stages: {', '.join(names)})"
            )
        if e.source == e.target:
            problems.append(f"{where}: a stage cannot feed itself")
        if e.every < 1:
            problems.append(f"{where}: every must be >= 1, got {e.every}")
        if e.target in incoming:
            if e.source in incoming[e.target]:
                problems.append(f"{where}: duplicate edge")
            incoming[e.target].append(e.source)
    for target, sources in incoming.items():
        if len(sources) > 1:
            streaming = [
                e.source for e in cfg.edges if e.target == target and e.forward != "finish"
            ]
            if streaming:
                problems.append(
                    f"stage {target!r} has several inputs ({', '.join(sources)}); fan-in waits "
                    f'for every input to finish, so those edges need forward = "finish" '
                    f"(edge from {streaming[0]!r} streams)"
                )
    return problems


def _replica_problems(st: StageConfig) -> list[str]:
    """A fixed count must be >= 1; a range (``replicas = {min, max}``) must
    start with at least one replica (a stage with none refuses every
    request: readiness needs one), end at or above its start, and say
    thresholds that can be met."""
    where = f"stage {st.name!r}"
    r = st.replicas
    if not isinstance(r, ReplicaRange):
        return [] if r >= 1 else [f"{where}: replicas must be >= 1, got {r}"]
    problems = []
    if r.min < 1:
        problems.append(
            f"{where}: replicas.min must be >= 1, got {r.min} (a stage with no replica "
            "refuses every request; the server is ready once min replicas are)"
        )
    if r.max < r.min:
        problems.append(
            f"{where}: replicas.max ({r.max}) must be >= replicas.min ({r.min}); "
            "for a fixed count write replicas = N"
        )
    if r.up_queue < 1:
        problems.append(f"{where}: replicas.up_queue must be >= 1, got {r.up_queue}")
    if r.up_after < 1:
        problems.append(f"{where}: replicas.up_after must be >= 1, got {r.up_after}")
    if r.down_after_s < 0:
        problems.append(f"{where}: replicas.down_after_s must be >= 0, got {r.down_after_s}")
    problems.extend(_shared_gpu_problems(st, r.max))
    return problems


def _shared_gpu_problems(st: StageConfig, replicas: int) -> list[str]:
    """vLLM replicas beyond the stage's device groups share a GPU, each
    taking ``gpu_memory_utilization`` of it: at most 1 in all."""
    eng = st.engine
    try:
        devices = parse_devices(st.devices)
    except ValueError:
        return []  # device_problems says why
    if not isinstance(eng, VllmArgs) or not devices or eng.gpu_memory_utilization <= 0:
        return []
    groups = max(1, len(devices) // replica_width(st))
    per_gpu = -(-replicas // groups)
    if per_gpu * eng.gpu_memory_utilization <= 1.0:
        return []
    return [
        f"stage {st.name!r}: replicas.max = {replicas} over devices {st.devices!r} puts "
        f"{per_gpu} vLLM replicas on one GPU, each taking gpu_memory_utilization = "
        f"{eng.gpu_memory_utilization:g} of it ({per_gpu * eng.gpu_memory_utilization:g} > 1): "
        "give more devices, a lower max or a lower gpu_memory_utilization"
    ]


def _diffusers_problems(eng: DiffusersArgs) -> list[str]:
    problems = [
        f"engine.{field} must be >= 1, got {getattr(eng, field)}"
        for field in ("max_batch", "default_steps", "default_size", "default_frames")
        if getattr(eng, field) < 1
    ]
    if not 1 <= eng.default_fps <= 120:
        problems.append(f"engine.default_fps must be 1..120, got {eng.default_fps}")
    problems.extend(cache_problems(eng.cache, eng.compile))
    pipeline = _folder_pipeline(eng.model)
    if pipeline is not None:
        found = [family_problem(eng.cache, pipeline), cfg_batch_problem(eng.cfg_batch, pipeline)]
        problems.extend(filter(None, found))
    return problems


def _folder_pipeline(model: str) -> str | None:
    """The pipeline class of a stage's model given as a local diffusers
    folder (``model_index.json``); None for a name, resolved by the
    engine's side (``omnix.engines.diffusers_model``) at start."""
    index = Path(model).expanduser() / "model_index.json"
    try:
        value = msgspec.json.decode(index.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None
    name = value.get("_class_name") if isinstance(value, dict) else None
    return name if isinstance(name, str) else None


def _talker_problems(eng: TalkerArgs) -> list[str]:
    problems = [
        f"engine.{field} must be >= 1, got {getattr(eng, field)}"
        for field in ("max_batch", "max_len")
        if getattr(eng, field) < 1
    ]
    buckets = list(eng.graph_buckets)
    if not buckets or buckets != sorted(set(buckets)) or buckets[0] < 1:
        problems.append(f"engine.graph_buckets must be increasing sizes >= 1, got {buckets}")
    elif eng.decode != "eager" and eng.max_batch > buckets[-1]:
        problems.append(
            f"engine.max_batch {eng.max_batch} is larger than the largest graph bucket "
            f"{buckets[-1]}: add a bucket to engine.graph_buckets or lower max_batch"
        )
    return problems


def _duplex_problems(eng: DuplexArgs) -> list[str]:
    problems = []
    if eng.max_sessions < 1:
        problems.append(f"moshi_duplex max_sessions must be >= 1, got {eng.max_sessions}")
    if eng.tick_ms < 0:
        problems.append(
            f"moshi_duplex tick_ms must be >= 0 (80: real time; 0: as frames come), "
            f"got {eng.tick_ms}"
        )
    return problems


def _speech_problems(cfg: PipelineConfig) -> list[str]:
    """A thinker that feeds a talker its context runs omnix's capture: its
    worker extension and its thinker class (``hf_overrides``), which the
    stage may not swap, and vLLM's piecewise CUDA graphs (a full graph
    replays the whole forward without the Python that hands the hidden
    states on)."""
    problems = []
    for st in cfg.stages:
        eng = st.engine
        if not isinstance(eng, VllmArgs) or not eng.talker_context:
            continue
        for key, what in (
            ("worker_extension_cls", "omnix's own worker extension (the hidden-state capture)"),
            ("hf_overrides", "omnix's thinker class (hf_overrides.architectures)"),
        ):
            if eng.engine_args.get(key):
                problems.append(
                    f"stage {st.name!r}: engine_args.{key}: talker_context runs {what}; leave it out"
                )
        compilation = eng.engine_args.get("compilation_config")
        mode = compilation.get("cudagraph_mode") if isinstance(compilation, dict) else None
        if isinstance(mode, str) and mode.upper() not in ("NONE", "PIECEWISE"):
            problems.append(
                f"stage {st.name!r}: compilation_config.cudagraph_mode {mode!r}: talker_context "
                "needs NONE or PIECEWISE (a full CUDA graph replays the forward without the "
                "hidden-state capture)"
            )
    return problems


def _vllm_problems(eng: VllmArgs) -> list[str]:
    """A vLLM stage's own settings: its typed fields' ranges (0 leaves one
    to vLLM), its ``engine_args`` checked against the installed vLLM, its
    chat template."""
    problems = []
    for field in ("max_model_len", "max_num_seqs"):
        if getattr(eng, field) < 0:
            problems.append(f"{field} must be >= 0 (0: vLLM's default), got {getattr(eng, field)}")
    if not 0 <= eng.gpu_memory_utilization <= 1:
        problems.append(
            "gpu_memory_utilization must be from 0 (vLLM's default) to 1, got "
            f"{eng.gpu_memory_utilization}"
        )
    if eng.kv_cache_gib < 0:
        problems.append(f"kv_cache_gib must be >= 0 (0: vLLM's default), got {eng.kv_cache_gib}")
    if eng.engine_args:
        from omnix.pipelines.vllm_args import check_engine_args

        problems.extend(check_engine_args(eng.engine_args))
    from omnix.pipelines.vllm_args import load_chat_template, parser_problems, vllm_installed

    problems.extend(
        parser_problems(eng.tool_call_parser, eng.reasoning_parser, eng.enable_auto_tool_choice)
    )

    if eng.chat_template and vllm_installed():
        try:
            load_chat_template(eng.chat_template)
        except (OSError, ValueError) as exc:
            problems.append(f"chat_template: {exc}")
    return problems


def _media_problems(cfg: PipelineConfig) -> list[str]:
    problems = []
    targets = {e.target for e in cfg.edges}
    declared = []
    for st in cfg.stages:
        m = st.media
        if m is None:
            continue
        where = f"stage {st.name!r}: media"
        if st.name in targets:
            problems.append(
                f"{where}: only a source stage (no incoming edge) takes media from the request"
            )
            continue
        declared.append((st.name, m))
        for field in (
            "max_part_bytes",
            "max_pixels",
            "max_audio_parts",
            "max_image_parts",
            "max_video_parts",
            "max_video_frames",
            "sample_rate",
        ):
            if getattr(m, field) < (0 if field.endswith("_parts") else 1):
                problems.append(f"{where}.{field} must be positive, got {getattr(m, field)}")
        for name in ("max_audio_seconds", "max_video_seconds", "video_fps"):
            if getattr(m, name) <= 0:
                problems.append(f"{where}.{name} must be > 0, got {getattr(m, name)}")
        eng = st.engine
        if isinstance(eng, VllmArgs):
            if eng.input_mode != "chat":
                problems.append(
                    f'{where}: media input needs input_mode = "chat", got {eng.input_mode!r}'
                )
            for kind, on, most in (
                ("audio", m.audio, m.max_audio_parts),
                ("image", m.image, m.max_image_parts),
                ("video", m.video, m.max_video_parts),
            ):
                limit = eng.limit_mm_per_prompt.get(kind)
                if on and limit is not None and limit < most:
                    problems.append(
                        f"{where}.max_{kind}_parts = {most} but the engine's limit_mm_per_prompt.{kind} "
                        f"is {limit}: vLLM would refuse such prompts; lower one or raise the other"
                    )
    if len({m for _, m in declared}) > 1:
        names = ", ".join(n for n, _ in declared)
        problems.append(
            f"source stages {names} declare different media: the request's media go to all of them"
        )
    return problems


def stage_output_modality(cfg: PipelineConfig, stage: str) -> str | None:
    """What a stage's engine produces, when its kind says (None: any)."""
    eng = cfg.stage(stage).engine
    if isinstance(eng, (VllmArgs, ScriptedArgs)):
        return eng.output_modality
    if isinstance(eng, DiffusersArgs):
        return eng.output_modality
    if isinstance(eng, (AudioEngineArgs, DuplexArgs)):
        return "audio"
    if isinstance(eng, TalkerArgs):
        return "codec"
    return None


def _find_cycle(names: list[str], cfg: PipelineConfig) -> list[str]:
    out: dict[str, list[str]] = {n: [] for n in names}
    for e in cfg.edges:
        if e.source in out and e.target in out:
            out[e.source].append(e.target)
    color = dict.fromkeys(names, 0)
    stack: list[str] = []

    def visit(n: str) -> list[str]:
        color[n] = 1
        stack.append(n)
        for m in out[n]:
            if color[m] == 1:
                return [*stack[stack.index(m) :], m]
            if color[m] == 0:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        color[n] = 2
        return []

    for n in names:
        if color[n] == 0:
            found = visit(n)
            if found:
                return found
    return []
