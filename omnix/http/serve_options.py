"""``omnix serve``'s flags turned into what the server is built from.

Owns: ``http_options`` (the HTTP layer's ``HttpOptions``, shared with
``omnix frontend``), ``build_omni`` (the pipeline's models prepared and
the ``Omni`` serving it, with its one ``RuntimeOptions``, its retention
policy and log config), ``retention_policy`` (the ``--retain*`` flags),
and the one-line ``UsageError`` naming the flag for a value that is not
one.

Does not own the flags themselves (``serve_flags.py``), the value parsers
(``quantities.py``), the runtime (``Omni``/``StageRuntime``) nor the
process lifecycle (``serve.py``).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from omnix.http.options import HttpOptions
from omnix.http.quantities import parse_count, parse_duration, parse_size
from omnix.http.serve_pipeline import ServedPipeline, check_diffusion_caches, check_with_vllm
from omnix.usage import UsageError

if TYPE_CHECKING:
    from omnix.api import Omni
    from omnix.events.disklog import LogConfig
    from omnix.events.natslog import NatsLog
    from omnix.events.retention import RetentionPolicy


def http_options(args: argparse.Namespace, names: tuple[str, ...] = ()) -> HttpOptions:
    """The HTTP layer's options from the flags; ``UsageError`` (one line
    naming the flag) for a value that is not one."""
    from omnix.http.core.cors import parse_origins

    try:
        origins = parse_origins(args.allowed_origins)
    except ValueError as bad:
        raise UsageError(f"--allowed-origins: {bad}") from None
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1 (got {args.max_batch})")
    if args.max_body_mb <= 0:
        raise UsageError(f"--max-body-mb must be positive (got {args.max_body_mb})")
    return HttpOptions(
        api_key=args.api_key,
        max_body=int(args.max_body_mb * 1024 * 1024),
        max_batch=args.max_batch,
        resume_grace_s=args.resume_grace,
        allowed_origins=origins,
        allowed_media_domains=_domains(args.allowed_media_domains),
        served_model_names=names,
        # Uploaded voices live beside the log they are cloned in (a
        # frontend, which has no --log-dir, keeps its own for its lifetime).
        voice_dir=log_dir / "voices" if (log_dir := getattr(args, "log_dir", None)) else None,
    )


def build_omni(
    args: argparse.Namespace, served: ServedPipeline, log: NatsLog | None = None
) -> Omni:
    """The pipeline's models and the ``Omni`` serving it, as the flags
    say; ``UsageError`` for what the operator must fix, in one line.
    ``log``: a replicated log this server follows (a standby until it leads)."""
    from omnix.api import Omni
    from omnix.events.disklog import LogError
    from omnix.models.prepare import prepare_models
    from omnix.pipelines.validate import PipelineError
    from omnix.stages.options import RuntimeOptions
    from omnix.stages.runtime import RuntimeConfigError

    try:
        retention = retention_policy(args.retain, args.retain_requests, args.retain_bytes)
    except ValueError as bad:
        raise UsageError(str(bad)) from None
    if args.archive and args.log_dir is None:
        raise UsageError("--archive moves released log segments aside: it needs --log-dir DIR")
    try:
        pipeline = served.pipeline
        spawn = _spawn_choice(args.spawn)
        prepare_models(pipeline, args.model_dir, build=not args.no_build)
        check_with_vllm(served)
        check_diffusion_caches(pipeline)
        return Omni(
            pipeline,
            log_dir=args.log_dir,
            log=log,
            blobs=log.blobs if log is not None else None,
            standby=log is not None,
            # pin_server: this process joins the frontend CPUs of the runtime's
            # placement (docs/runtime.md), away from the vLLM engine cores.
            runtime_options=RuntimeOptions(
                start_timeout_s=args.start_timeout,
                pin_server=True,
                endpoint=args.workers_endpoint,
                spawn=spawn,
                fork_workers=not args.cold_workers,
                worker_token=args.worker_token,
                profile_dir=args.profile_dir,
                placement=args.placement,
                ray_address=args.ray_address,
            ),
            resume_within_s=args.resume_within,
            retention=retention,
            log_config=_log_config(args.archive),
        )
    except (PipelineError, LogError, RuntimeConfigError) as bad:
        raise UsageError(str(bad)) from None
    except OSError as bad:  # --log-dir
        raise UsageError(
            f"--log-dir {args.log_dir}: cannot keep the log there ({bad.strerror or bad})"
        ) from None


def _spawn_choice(text: str) -> bool | list[str]:
    """``--spawn``: all, none, or a comma-separated list of stages (the
    runtime checks the names against the pipeline)."""
    word = text.strip().lower()
    if word == "all":
        return True
    if word == "none":
        return False
    return [name for name in (part.strip() for part in text.split(",")) if name]


def retention_policy(retain: str, requests: str, size: str) -> RetentionPolicy:
    """The ``RetentionPolicy`` the ``--retain*`` flags ask for; ``ValueError``
    (one line naming the flag) for a value that is not one."""
    from omnix.events.retention import RetentionPolicy

    return RetentionPolicy(
        window_s=parse_duration(retain),
        max_requests=parse_count(requests),
        max_bytes=parse_size(size),
    )


def _log_config(archive: bool) -> LogConfig | None:
    if not archive:
        return None
    from omnix.events.disklog import LogConfig

    return LogConfig(archive=True)


def _domains(value: str) -> frozenset[str]:
    """``--allowed-media-domains``: exact host names, case-folded."""
    return frozenset(d.strip().lower().rstrip(".") for d in value.split(",") if d.strip())
