"""deploy/k8s/: the Kubernetes manifests parse, agree with the pipeline
they carry, and every container's command runs as this omnix's CLI.

No cluster runs here.  Each manifest is parsed (pyyaml); the pipeline in
its ConfigMap validates; the RayCluster's worker groups offer the
resources the pipeline's placement tables ask for.  Then each container's
command line runs as a local process, with only what Kubernetes would
provide swapped for local things: the volumes' mount paths for temporary
folders, the Service's name and the fixed ports for 127.0.0.1 and free
ports, the Secret's value through its environment, and the pipeline's
engines for scripted ones (the same stage names and placement tables, no
model load; no GPU here, so num_gpus 0).  The by-hand manifests: the
server and one worker per stage Deployment join and the server is ready.
The RayCluster: its head's `omnix serve` (after Ray's own start) serves
with `--placement ray` on the session's loopback Ray cluster, with a node
added per worker group offering that group's resources.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
import yaml

from omnix.pipelines.config import PipelineConfig, Placement, ScriptedArgs
from omnix.pipelines.validate import parse_pipeline, validate_pipeline
from omnix.testing.ray_cluster import add_node
from omnix.testing.served import ServeProcess

ASYNC = pytest.mark.asyncio(loop_scope="session")

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def pipeline_of_configmap() -> PipelineConfig:
    return parse_pipeline(one("ConfigMap", "omnix-pipeline")["data"]["pipeline.toml"])


def scripted(cfg: PipelineConfig) -> str:
    """``cfg`` with scripted engines (the same stages, edges and placement
    resources; no GPU), as TOML."""
    from omnix.pipelines.toml_out import pipeline_toml

    stages = tuple(
        msgspec.structs.replace(
            st,
            engine=ScriptedArgs(
                output_modality="codec" if st.name == "talker" else "audio", delay_ms=1
            ),
            placement=msgspec.structs.replace(
                st.placement or Placement(), num_gpus=0, num_cpus=0.5
            ),
        )
        for st in cfg.stages
    )
    out = msgspec.structs.replace(cfg, stages=stages)
    validate_pipeline(out)
    return pipeline_toml(out)


def test_every_manifest_parses_and_names_itself():
    docs = manifests()
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ConfigMap", "Deployment", "PersistentVolumeClaim", "RayCluster", "Secret", "Service",
    ]  # fmt: skip
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"], d
    stages = {st.name for st in pipeline_of_configmap().stages}
    deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"} - {
        "omnix-server"
    }
    assert deployments == {f"omnix-stage-{s}" for s in stages}
    for name in deployments:
        (worker,) = one("Deployment", name)["spec"]["template"]["spec"]["containers"]
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
        env = {e["name"]: e for e in worker["env"]}
        assert env["OMNIX_WORKER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == (
            "omnix-worker-token"
        )


def test_the_ray_cluster_offers_what_the_pipeline_places():
    cfg = pipeline_of_configmap()
    rc = one("RayCluster", "omnix")
    offered = {
        g["groupName"]: json.loads(json.loads(g["rayStartParams"]["resources"]))
        for g in rc["spec"]["workerGroupSpecs"]
    }
    for st in cfg.stages:
        assert st.placement is not None
        assert any(
            all(res.get(k, 0) >= v for k, v in st.placement.resources.items())
            for res in offered.values()
        ), (st.name, offered)
    assert rc["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"


# -- running the containers' commands -----------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Local:
    """What Kubernetes provides a pod, made local: mount paths -> folders,
    the server's Service -> 127.0.0.1 and a free workers port, Secrets."""

    def __init__(self, tmp: Path, pipeline_toml: str) -> None:
        self.workers_port = free_port()
        self.mounts = {"/etc/omnix": tmp / "etc-omnix", "/models": tmp / "models"}
        for p in self.mounts.values():
            p.mkdir(parents=True, exist_ok=True)
        data = one("ConfigMap", "omnix-pipeline")["data"]
        for name, text in data.items():
            (self.mounts["/etc/omnix"] / name).write_text(text)
        (self.mounts["/etc/omnix"] / "pipeline.toml").write_text(pipeline_toml)
        self.secrets = {
            d["metadata"]["name"]: d["stringData"] for d in manifests() if d["kind"] == "Secret"
        }

    def word(self, w: str) -> str:
        for mount, local in self.mounts.items():
            if w == mount or w.startswith(mount + "/"):
                w = str(local) + w[len(mount) :]
        w = w.replace("tcp://omnix-server:5555", f"tcp://127.0.0.1:{self.workers_port}")
        w = w.replace("tcp://0.0.0.0:5555", f"tcp://127.0.0.1:{self.workers_port}")
        return {"0.0.0.0": "127.0.0.1", "8091": "0"}.get(w, w)

    def argv(self, words: list[str]) -> list[str]:
        assert words[0] == "omnix", words
        return [sys.executable, "-m", "omnix.cli", *(self.word(w) for w in words[1:])]

    def env(self, container: dict[str, Any]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIX_WORKER")}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = self.word(e["value"])
            else:
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = self.secrets[ref["name"]][ref["key"]]
        return env

    def config(self, name: str) -> Path:
        """A serve config of the ConfigMap with its values made local."""
        path = self.mounts["/etc/omnix"] / name
        data = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({k: self.word(str(v)) for k, v in data.items()}))
        return path


async def run(argv: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )


async def wait_ready(url: str, timeout: float = 120) -> None:  # noqa: ASYNC109
    async with aiohttp.ClientSession() as http, asyncio.timeout(timeout):
        while (await http.get(url + "/ready")).status != 200:  # noqa: ASYNC110 (polling a server)
            await asyncio.sleep(0.2)


async def serve(argv: list[str], env: dict[str, str]) -> ServeProcess:
    proc = await asyncio.create_subprocess_exec(
        *argv, env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    return ServeProcess(proc)


async def stop(served: ServeProcess) -> int:
    served.proc.send_signal(signal.SIGINT)
    async with asyncio.timeout(60):
        return await served.proc.wait()


@ASYNC
async def test_the_by_hand_manifests_commands_run_a_server_and_its_stage_workers(tmp_path):
    local = Local(tmp_path, scripted(pipeline_of_configmap()))
    (server,) = one("Deployment", "omnix-server")["spec"]["template"]["spec"]["containers"]
    served = await serve(local.argv(server["command"] + server["args"]), local.env(server))
    workers: list[asyncio.subprocess.Process] = []
    try:
        url = await served.ready(120)
        log = "".join(served.lines)
        assert f"tcp://127.0.0.1:{local.workers_port}" in log and "--worker-token" in log, log
        for name in ("omnix-stage-talker", "omnix-stage-code2wav"):
            init, worker = pod_containers(one("Deployment", name))
            made = await run(local.argv(init["command"]), local.env(init))
            out, _ = await made.communicate()
            assert made.returncode == 0, out.decode()
            workers.append(
                await run(local.argv(worker["command"] + worker["args"]), local.env(worker))
            )
        await wait_ready(url)
        assert await stop(served) == 0
        for w in workers:  # told to stop by the server
            async with asyncio.timeout(30):
                assert await w.wait() == 0, (await w.stdout.read()).decode()
    finally:
        await served.close()
        for w in workers:
            if w.returncode is None:
                w.kill()
                await w.wait()
    assert sorted(p.name for p in local.mounts["/models"].iterdir()) >= ["code2wav", "talker"]


@ASYNC
async def test_the_ray_cluster_head_command_serves_with_placement_ray(ray_cluster, tmp_path):
    local = Local(tmp_path, scripted(pipeline_of_configmap()))
    rc = one("RayCluster", "omnix")
    for group in rc["spec"]["workerGroupSpecs"]:
        add_node(ray_cluster, json.loads(json.loads(group["rayStartParams"]["resources"])))
    (head,) = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    # KubeRay's `ray start` first (the cluster here is the session's), then ours.
    script = head["args"][0]
    command = re.search(r"exec (omnix serve .*)$", script)
    assert command and "${KUBERAY_GEN_RAY_START_CMD" in script, script
    words = shlex.split(command.group(1))
    words[words.index("--config") + 1] = str(local.config("serve-ray.yaml"))
    env = local.env(head)
    for k in [k for k in env if k.startswith("RAY_AUTH")]:
        del env[k]  # the session's cluster runs without Ray's token auth
    env["RAY_ADDRESS"] = ray_cluster.address  # what `ray-address: auto` finds on a Ray node
    served = await serve(local.argv(words), env)
    try:
        url = await served.ready(120)
        await wait_ready(url)
        assert await stop(served) == 0
    finally:
        await served.close()
    out = "".join(served.lines)
    assert f"workers endpoint tcp://127.0.0.1:{local.workers_port}" in out, out
