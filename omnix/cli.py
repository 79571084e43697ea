"""The ``omnix`` command line: one verb per capability.

Owns: the top-level parser, lazy dispatch and how a verb's user error
ends: one line, ``omnix VERB: error: MESSAGE``, exit status 2 (argparse's
own style, for errors found after parsing too: ``omnix.usage``; a flag the
verb does not have is reported so as well, with the closest it has), and
Ctrl-C ends with status 130 and no traceback.  Each verb lives in the
module that owns the capability and exposes ``add_arguments(parser)`` and
``run(args) -> int``, raising ``UsageError`` for what its user must fix;
importing them lazily keeps ``omnix --help`` fast and keeps a codec worker
from importing vLLM.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys

from omnix.usage import run_reporting

# verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "serve": ("omnix.http.serve", "serve a pipeline over the OpenAI-compatible HTTP API"),
    "worker": ("omnix.stages.worker_cli", "run one stage worker and join a server"),
    "frontend": (
        "omnix.http.frontend",
        "serve the HTTP API for a pipeline led by another server on a replicated log",
    ),
    "models": ("omnix.models.cli", "build the tiny local models the built-in pipelines use"),
    "pipelines": ("omnix.pipelines.cli", "list, show and validate pipeline configs"),
    "generate": ("omnix.offline_cli", "run one request through a pipeline without HTTP"),
    "trace": ("omnix.replay.trace_cli", "export a request's events as a replayable trace"),
    "replay": ("omnix.replay.cli", "replay a captured trace: show, drive, counterfactual, faults"),
    "telemetry": ("omnix.telemetry.cli", "re-emit the spans and metrics of a captured trace"),
    "bench": (
        "omnix.bench.cli",
        "benchmarks that print figures (each takes --json: one JSON object on its last line)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omnix",
        description="omnix: an event-sourced orchestration engine for multi-stage "
        "omni-modality model pipelines.",
    )
    parser.add_argument("--version", action="version", version=f"omnix {_version()}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (module, help_) in VERBS.items():
        p = sub.add_parser(verb, help=help_, description=help_)
        # _prog: what a UsageError is reported as (a verb with sub-verbs
        # sets its own, e.g. "omnix bench engines").
        p.set_defaults(_module=module, _prog=p.prog)
        # Only the chosen verb's module is imported to add its arguments.
        if verb in _requested_verb():
            importlib.import_module(module).add_arguments(p)
    return parser


def _requested_verb() -> tuple[str, ...]:
    for arg in sys.argv[1:]:
        if not arg.startswith("-"):
            return (arg,)
    return ()


def _version() -> str:
    from omnix import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    parser = build_parser()
    args, extra = parser.parse_known_args()
    if not getattr(args, "_module", None):
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        parser.print_help()
        return 0
    if extra:
        return _unrecognized(parser, args, extra)
    module = importlib.import_module(args._module)
    try:
        return run_reporting(args._prog, lambda: int(module.run(args) or 0))
    except KeyboardInterrupt:
        return 130


def _unrecognized(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]
) -> int:
    """A flag the verb does not have: one line naming it as the verb's
    error (``omnix serve: error: ...``), with the verb's closest flags."""
    verb = _verb_parser(parser, args.verb)
    known = sorted(verb._option_string_actions) if verb is not None else []
    flags = [e.split("=", 1)[0] for e in extra if e.startswith("-")]
    near = [n for f in flags for n in difflib.get_close_matches(f, known, n=2, cutoff=0.7)]
    hint = f" (did you mean {', '.join(dict.fromkeys(near))}?)" if near else ""
    where = " (neither omnix's nor one of vLLM's engine flags)" if args.verb == "serve" else ""
    print(
        f"{args._prog}: error: unrecognized arguments: {' '.join(extra)}{where}{hint}",
        file=sys.stderr,
    )
    return 2


def _verb_parser(parser: argparse.ArgumentParser, verb: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser | None = action.choices.get(verb)
            return found
    return None


if __name__ == "__main__":
    sys.exit(main())
