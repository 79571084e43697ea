"""``omnix models``: build and inspect the tiny local models.

Owns: the verb's arguments and output.  Does not own building
(``omnix.models.build``) or the cache location (``omnix.models.paths``).

    omnix models init [--dir DIR] [--seed N] [--force] [--only NAME ...]
    omnix models list [--dir DIR]      (also: plain `omnix models`)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omnix.usage import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from omnix.models.paths import TINY_MODELS

    sub = parser.add_subparsers(dest="models_cmd", metavar="COMMAND")
    init = sub.add_parser(
        "init", help="build the tiny models that are missing (or all with --force)"
    )
    init.set_defaults(_prog=init.prog)
    init.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="model folder (default: $OMNIX_MODEL_DIR or ~/.cache/omnix/models)",
    )
    init.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    init.add_argument("--force", action="store_true", help="rebuild models that already exist")
    init.add_argument(
        "--only",
        nargs="+",
        choices=TINY_MODELS,
        default=list(TINY_MODELS),
        metavar="NAME",
        help=f"build only these ({', '.join(TINY_MODELS)})",
    )
    ls = sub.add_parser("list", help="show the tiny models, where they are and their digests")
    ls.add_argument("--dir", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    from omnix.models.paths import TINY_MODELS, default_model_dir, folder_digest, read_info

    cmd = getattr(args, "models_cmd", None) or "list"
    root = (getattr(args, "dir", None) or default_model_dir()).expanduser()
    if cmd == "init":
        from omnix.models.build import ensure_models, missing_models

        names = list(args.only)
        _writable(root, "--dir" if args.dir else "the model folder")
        todo = names if args.force else missing_models(root, None, names)
        if not todo:
            print(f"all models present in {root} (use --force to rebuild)")
        if not args.force:
            for name in names:
                info = read_info(root / name)
                if name not in todo and info is not None and info.seed != args.seed:
                    print(
                        f"{name} was built with seed {info.seed}, kept: --force rebuilds it "
                        f"with seed {args.seed}"
                    )
        ensure_models(root, seed=args.seed, names=names, force=args.force, progress=True)
    for name in TINY_MODELS:
        info = read_info(root / name)
        if info is None:
            print(f"{name:9s} missing    {root / name}")
        else:
            print(
                f"{name:9s} seed={info.seed:<5d} {folder_digest(root / name)[:16]}  {root / name}"
            )
    return 0


def _writable(root: Path, label: str) -> None:
    """The model folder can be made and written, checked before the first
    model is built (minutes) so a bad ``--dir`` fails at once."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".omnix-write-check"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise UsageError(
            f"{label} {root}: cannot build models there ({exc.strerror or exc}); "
            "give a folder you can write (or set OMNIX_MODEL_DIR)"
        ) from None
