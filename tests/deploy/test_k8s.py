"""deploy/k8s/: the Kubernetes manifests are valid Kubernetes objects, agree
with the pipelines they carry, and every container's command runs as this
omnix's CLI.

No cluster runs here.  Each manifest is parsed (pyyaml) and validated,
offline, against the Kubernetes JSON schemas the ``kubernetes-validate``
wheel ships (strict: an unknown field is an error).  The RayCluster is a
KubeRay custom resource, which those schemas do not hold: its pod
templates are validated against Kubernetes' own PodTemplateSpec schema and
its RayCluster fields against ``RAYCLUSTER_SCHEMA`` below (the ray.io/v1
fields this manifest uses, typed as KubeRay's CRD types them, any other
field refused); then Ray's own KubeRay autoscaler reads it, as it does in
the cluster, and the node types it derives must hold every stage's
replicas between the pipeline's ``min`` and ``max``.  The pipelines in the
ConfigMap validate.  Then each container's
command line runs as a local process, with only what Kubernetes would
provide swapped for local things: the volumes' mount paths for temporary
folders (so the server's log lands in the folder its volume stands for), the Service's name and the fixed ports for 127.0.0.1 and free
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


def manifest(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def pipeline_of_configmap(key: str = "pipeline.toml") -> PipelineConfig:
    return parse_pipeline(manifest("ConfigMap", "omnix-pipeline")["data"][key])


def scripted(cfg: PipelineConfig) -> str:
    """``cfg`` with scripted engines (the same stages, replicas, edges and
    placement resources; no GPU), as TOML."""
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


def test_every_manifest_parses_and_names_itself_once():
    docs = manifests()
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == [
        "ConfigMap", "Deployment", "PersistentVolumeClaim", "RayCluster", "Secret", "Service",
    ]  # fmt: skip
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"], d
    # By hand and Ray can stand in one namespace: no two objects (the two
    # Services above all) share a kind and a name.
    named = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert sorted(set(named)) == sorted(named), named
    stages = {st.name for st in pipeline_of_configmap().stages}
    deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"} - {
        "omnix-server"
    }
    assert deployments == {f"omnix-stage-{s}" for s in stages}
    for name in deployments:
        (worker,) = manifest("Deployment", name)["spec"]["template"]["spec"]["containers"]
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
        env = {e["name"]: e for e in worker["env"]}
        assert env["OMNIX_WORKER_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == (
            "omnix-worker-token"
        )


def test_the_by_hand_and_ray_pipelines_are_one_pipeline_that_scales_only_under_ray():
    fixed, ray = pipeline_of_configmap(), pipeline_of_configmap("pipeline-ray.toml")
    assert all(st.scaling is None for st in fixed.stages)  # --spawn none: nothing to scale
    assert all(st.scaling is not None for st in ray.stages)
    unscaled = msgspec.structs.replace(
        ray,
        stages=tuple(
            msgspec.structs.replace(a, replicas=b.replicas)
            for a, b in zip(ray.stages, fixed.stages, strict=True)
        ),
    )
    assert unscaled == fixed
    serve_ray = yaml.safe_load(manifest("ConfigMap", "omnix-pipeline")["data"]["serve-ray.yaml"])
    assert serve_ray["pipeline"] == "/etc/omnix/pipeline-ray.toml"


# -- Kubernetes' schemas --------------------------------------------------------

K8S_VERSION = "1.37"


def kubernetes_definitions() -> Any:
    """The Kubernetes API's definitions as the validator's wheel ships them
    (strict: ``additionalProperties: false`` everywhere)."""
    from kubernetes_validate.utils import schema_contents

    return schema_contents(
        f"kubernetes-json-schema/v{K8S_VERSION}.0-local-strict/_definitions.json", K8S_VERSION
    )


def k8s_ref(name: str) -> dict[str, str]:
    return {"$ref": f"/api/_definitions.json#/$defs/io.k8s.api.core.v1.{name}"}


_INT32 = {"type": "integer", "format": "int32", "minimum": 0}
_START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}

#: The ray.io/v1 RayCluster fields raycluster.yaml uses, typed as KubeRay's
#: CRD (v1.1 and later) types them; any other field is refused (the API
#: server would drop an unknown one silently, and the setting with it).
#: The pod templates and the autoscaler's environment are Kubernetes' own
#: types, checked against Kubernetes' schemas.
RAYCLUSTER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": {
            "$ref": "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        },
        "spec": {
            "type": "object",
            "required": ["headGroupSpec"],
            "additionalProperties": False,
            "properties": {
                "enableInTreeAutoscaling": {"type": "boolean"},
                "autoscalerOptions": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "upscalingMode": {"enum": ["Default", "Aggressive", "Conservative"]},
                        "idleTimeoutSeconds": _INT32,
                        "env": {"type": "array", "items": k8s_ref("EnvVar")},
                        "image": {"type": "string"},
                        "version": {"enum": ["v1", "v2"]},
                    },
                },
                "headGroupSpec": {
                    "type": "object",
                    "required": ["template"],
                    "additionalProperties": False,
                    "properties": {
                        "rayStartParams": _START_PARAMS,
                        "serviceType": {"type": "string"},
                        "template": k8s_ref("PodTemplateSpec"),
                    },
                },
                "workerGroupSpecs": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["groupName", "template"],
                        "additionalProperties": False,
                        "properties": {
                            "groupName": {"type": "string"},
                            "replicas": _INT32,
                            "minReplicas": _INT32,
                            "maxReplicas": _INT32,
                            "numOfHosts": _INT32,
                            "rayStartParams": _START_PARAMS,
                            "template": k8s_ref("PodTemplateSpec"),
                        },
                    },
                },
            },
        },
    },
}


def validate_raycluster(doc: dict[str, Any]) -> None:
    import jsonschema
    from referencing import Registry, Resource

    registry = Registry().with_resource(
        "https://kubernetes.io/api/_definitions.json",
        Resource.from_contents(kubernetes_definitions()),
    )
    schema = {"$id": "https://kubernetes.io/api/raycluster.json", **RAYCLUSTER_SCHEMA}
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc)


def test_every_manifest_is_valid_against_the_kubernetes_schemas():
    from kubernetes_validate.utils import validate

    for doc in manifests():
        if doc["kind"] == "RayCluster":
            validate_raycluster(doc)
        else:
            assert validate(doc, K8S_VERSION, strict=True) == K8S_VERSION


def test_the_kubernetes_schemas_refuse_a_misspelt_field():
    """The check above has teeth: a field a schema does not know, or a
    value of the wrong type, is an error, in the RayCluster too."""
    import jsonschema
    from kubernetes_validate.utils import validate

    server = manifest("Deployment", "omnix-server")
    server["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(jsonschema.ValidationError, match="volumeMount"):
        validate(server, K8S_VERSION, strict=True)
    for spoil in (
        lambda rc: rc["spec"].update(enableInTreeAutoscalling=True),
        lambda rc: rc["spec"]["workerGroupSpecs"][0].update(maxReplicas="4"),
        lambda rc: rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0].update(
            port=8091
        ),
    ):
        rc = manifest("RayCluster", "omnix")
        spoil(rc)
        with pytest.raises(jsonschema.ValidationError):
            validate_raycluster(rc)


def autoscaler_config(rc: dict[str, Any]) -> dict[str, Any]:
    """What Ray's KubeRay autoscaler makes of the RayCluster (its own code,
    which also validates the result against Ray's cluster schema)."""
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )

    rc = json.loads(json.dumps(rc))
    rc["metadata"]["namespace"] = "default"  # the API server's, as the autoscaler reads it
    return _derive_autoscaling_config_from_ray_cr(rc)


def test_the_ray_clusters_autoscaler_grows_each_group_as_far_as_its_stage_scales():
    rc = manifest("RayCluster", "omnix")
    assert rc["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    # minReplicas/maxReplicas act only through KubeRay's autoscaler.
    assert rc["spec"]["enableInTreeAutoscaling"] is True
    config = autoscaler_config(rc)
    types = {k: v for k, v in config["available_node_types"].items() if k != "headgroup"}
    assert config["available_node_types"]["headgroup"]["resources"] == {"CPU": 0}
    for st in pipeline_of_configmap("pipeline-ray.toml").stages:
        assert st.placement is not None and st.scaling is not None
        demand = {
            "CPU": st.placement.num_cpus, "GPU": st.placement.num_gpus,
            **st.placement.resources,
        }  # fmt: skip
        per_node = {
            name: min(int(t["resources"].get(k, 0) // v) for k, v in demand.items() if v)
            for name, t in types.items()
        }
        # Only this stage's group offers its node resource, and its nodes
        # hold its replicas from min (nodes there from the start) to max.
        (group,) = [name for name, n in per_node.items() if n > 0]
        assert group == st.name
        assert types[group]["min_workers"] * per_node[group] >= st.scaling.min, st.name
        assert types[group]["max_workers"] * per_node[group] >= st.scaling.max, st.name


def test_the_servers_log_is_on_a_claimed_volume_that_outlives_the_pod():
    serve_ray = yaml.safe_load(manifest("ConfigMap", "omnix-pipeline")["data"]["serve-ray.yaml"])
    server = manifest("Deployment", "omnix-server")
    (container,) = server["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    head = manifest("RayCluster", "omnix")["spec"]["headGroupSpec"]["template"]
    for pod, log_dir in (
        (server["spec"]["template"], args[args.index("--log-dir") + 1]),
        (head, serve_ray["log-dir"]),
    ):
        (c,) = pod["spec"]["containers"]
        (mount,) = [m for m in c["volumeMounts"] if log_dir.startswith(m["mountPath"] + "/")]
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
        claim = manifest("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
        assert "ReadWriteOnce" in claim["spec"]["accessModes"]
    # One writer on the log: the old pod ends before the new one starts.
    assert server["spec"]["strategy"] == {"type": "Recreate"}
    assert server["spec"]["replicas"] == 1


# -- running the containers' commands -----------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Local:
    """What Kubernetes provides a pod, made local: mount paths -> folders,
    the server's Service -> 127.0.0.1 and a free workers port, Secrets."""

    def __init__(self, tmp: Path) -> None:
        self.workers_port = free_port()
        self.mounts = {
            "/etc/omnix": tmp / "etc-omnix",
            "/models": tmp / "models",
            "/var/lib/omnix": tmp / "var-lib-omnix",
        }
        for p in self.mounts.values():
            p.mkdir(parents=True, exist_ok=True)
        data = manifest("ConfigMap", "omnix-pipeline")["data"]
        for name, text in data.items():
            (self.mounts["/etc/omnix"] / name).write_text(text)
        for key in ("pipeline.toml", "pipeline-ray.toml"):  # scripted engines, no GPU
            (self.mounts["/etc/omnix"] / key).write_text(scripted(pipeline_of_configmap(key)))
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
    local = Local(tmp_path)
    (server,) = manifest("Deployment", "omnix-server")["spec"]["template"]["spec"]["containers"]
    served = await serve(local.argv(server["command"] + server["args"]), local.env(server))
    workers: list[asyncio.subprocess.Process] = []
    try:
        url = await served.ready(120)
        log = "".join(served.lines)
        assert f"tcp://127.0.0.1:{local.workers_port}" in log and "--worker-token" in log, log
        for name in ("omnix-stage-talker", "omnix-stage-code2wav"):
            init, worker = pod_containers(manifest("Deployment", name))
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
    # The log went to the claimed volume's folder (what a restarted pod opens).
    assert any(p.is_file() for p in (local.mounts["/var/lib/omnix"] / "log").rglob("*"))


@ASYNC
async def test_the_ray_cluster_head_command_serves_with_placement_ray(ray_cluster, tmp_path):
    local = Local(tmp_path)
    rc = manifest("RayCluster", "omnix")
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
    assert any(p.is_file() for p in (local.mounts["/var/lib/omnix"] / "log").rglob("*"))
