"""``omnix bench placement``: start-up and the loss of a node under ``--placement ray``.

Owns four figures, measured on a real multi-node Ray cluster the bench
starts on this machine, on loopback only (``omnix.testing.ray_cluster``: a
head without CPUs, a node offering ``thinker_node`` and two offering
``decoder_node``), with one pipeline (by default the scripted two-stage
``ray-two``: a thinker, and a decoder pinned to the decoder nodes;
``--pipeline FILE`` for another whose stages ask for those resources):

* ``ready_s_spawn``: ``omnix serve`` (local worker processes) from its
  start to ``/ready`` answering 200;
* ``ready_s_ray``: the same command with ``--placement ray`` (joining the
  cluster, reserving the placement groups, one actor per replica);
* ``node_loss_recovery_s``: with ``--requests`` chat requests (text and
  audio) in flight, the node of the decoder's replica dies (its raylet
  removed without a goodbye, its replica's processes killed, as a host
  that dies) -> that replica ready again elsewhere: its actor answers
  from another node and ``/engines`` lists it;
* ``lost_requests``: requests in flight at the loss that did not finish
  with the undisturbed response (text and audio equal; must be 0).

Each is measured ``--runs`` times (default 3; a fresh pair of servers and
a replacement node each run): the figures are ``*_min`` and ``*_median``,
``lost_requests`` the sum, with the load average before and after.  Never
``ray stop``: the bench ends only the cluster it started.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from omnix.bench.loop import run_on_loop

BODY_AUDIO = {"modalities": ["text", "audio"], "audio": {"format": "wav", "voice": "default"}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3, help="times each figure is measured")
    parser.add_argument("--requests", type=int, default=4, help="requests in flight at the loss")
    parser.add_argument(
        "--pipeline",
        default=None,
        metavar="FILE",
        help="a pipeline whose stages ask for thinker_node / decoder_node, with a stage named "
        "decoder (default: the scripted two-stage ray-two)",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=300.0, help="seconds a server gets to be ready"
    )


def _say(msg: str) -> None:
    print(f"[bench placement] {msg}", file=sys.stderr, flush=True)


async def _serve(pipeline: Path, *flags: str, timeout: float) -> tuple[Any, str, float]:  # noqa: ASYNC109
    """``omnix serve`` started now: (its process, its url, seconds to /ready)."""
    import aiohttp

    from omnix.testing.served import ServeProcess

    t0 = time.perf_counter()
    served = await ServeProcess.start("--pipeline", str(pipeline), *flags)
    url = (await served.until(r"listening on (http://\S+)", timeout)).group(1)
    async with aiohttp.ClientSession() as http, asyncio.timeout(timeout):
        while (await http.get(url + "/ready")).status != 200:  # noqa: ASYNC110 (polling a server)
            await asyncio.sleep(0.01)
    return served, url, time.perf_counter() - t0


async def _stop(served: Any) -> None:
    if served.proc.returncode is None:
        served.proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(60):
                await served.proc.wait()
        except TimeoutError:
            pass
    await served.close()


async def _chat(url: str, model: str) -> tuple[str, str] | None:
    """One chat request's text and audio, or None when it did not finish."""
    import aiohttp

    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **BODY_AUDIO}
    async with aiohttp.ClientSession() as http:
        resp = await http.post(url + "/v1/chat/completions", json=body)
        if resp.status != 200:
            _say(f"a request ended {resp.status}: {(await resp.text())[:300]}")
            return None
        msg = (await resp.json())["choices"][0]["message"]
    return msg.get("content") or "", (msg.get("audio") or {}).get("data", "")


async def _where(actor: Any) -> dict[str, Any] | None:
    """Where the actor runs now; None while Ray restarts it."""
    from ray.exceptions import ActorUnavailableError

    try:
        return dict(await asyncio.wrap_future(actor.where.remote().future()))
    except ActorUnavailableError:
        return None


async def _decoder_listed(url: str) -> bool:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        rows = (await (await http.get(url + "/engines")).json())["engines"]
    return any(r["stage"] == "decoder" and r["replica"] == 0 for r in rows)


async def _node_loss(
    cluster: Any,
    served: Any,
    url: str,
    model: str,
    requests: int,
    timeout: float,  # noqa: ASYNC109
) -> tuple[float, int]:
    """(seconds from the loss to the decoder replica ready elsewhere, requests lost)."""
    import ray

    from omnix.stages.launcher import server_namespace
    from omnix.testing.ray_cluster import lose_node

    undisturbed = await _chat(url, model)
    if undisturbed is None or not undisturbed[0] or not undisturbed[1]:
        raise RuntimeError(f"the undisturbed request gave no text and audio: {undisturbed!r:.200}")
    actor = ray.get_actor("omnix-decoder-0", namespace=server_namespace(model, served.proc.pid))
    before = await _where(actor)
    assert before is not None, "the decoder's actor does not answer"
    flights = [asyncio.ensure_future(_chat(url, model)) for _ in range(requests)]
    await asyncio.sleep(0.5)  # mid-request: the decoder has output for each
    t0 = time.perf_counter()
    lose_node(cluster, before["node_id"], [before["actor_pid"], before["worker_pid"]])
    async with asyncio.timeout(timeout):
        while True:
            now = await _where(actor)
            moved = now is not None and now["node_id"] != before["node_id"] and now["worker_pid"]
            if moved and await _decoder_listed(url):
                break
            await asyncio.sleep(0.01)
    recovery = time.perf_counter() - t0
    results = await asyncio.gather(*flights)
    lost = sum(1 for r in results if r is None or r != undisturbed)
    return recovery, lost


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from omnix.pipelines.validate import load_pipeline
    from omnix.testing.pipelines import ray_two_stages_toml
    from omnix.testing.ray_cluster import add_node, loopback_cluster

    tmp = Path(tempfile.mkdtemp(prefix="omnix-bench-placement-"))
    pipeline = Path(args.pipeline) if args.pipeline else tmp / "ray-two.toml"
    if not args.pipeline:
        pipeline.write_text(ray_two_stages_toml())
    model = load_pipeline(pipeline).name
    res: dict[str, Any] = {"pipeline": model, "runs": args.runs, "requests": args.requests}
    res["load_average_start"] = round(os.getloadavg()[0], 2)
    figures: dict[str, list[float]] = {
        "ready_s_spawn": [], "ready_s_ray": [], "node_loss_recovery_s": [],
    }  # fmt: skip
    lost = 0
    import ray

    nodes: list[dict[str, float]] = [{"thinker_node": 1}, {"decoder_node": 1}, {"decoder_node": 1}]
    with loopback_cluster(nodes) as cluster:
        ray.init(address=cluster.address, logging_level=logging.WARNING, log_to_driver=False)
        for run in range(args.runs):
            served, _, ready = await _serve(pipeline, timeout=args.ready_timeout)
            figures["ready_s_spawn"].append(ready)
            await _stop(served)
            served, url, ready = await _serve(
                pipeline, "--placement", "ray", "--ray-address", cluster.address,
                timeout=args.ready_timeout,
            )  # fmt: skip
            figures["ready_s_ray"].append(ready)
            try:
                recovery, n = await _node_loss(
                    cluster, served, url, model, args.requests, args.ready_timeout
                )
            finally:
                await _stop(served)
            figures["node_loss_recovery_s"].append(recovery)
            lost += n
            _say(f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in figures.items()))
            add_node(cluster, {"decoder_node": 1})  # the next run loses one again
    for key, values in figures.items():
        res[f"{key}_min"] = round(min(values), 3)
        res[f"{key}_median"] = round(statistics.median(values), 3)
        res[key] = res[f"{key}_median"]
    res["lost_requests"] = lost
    res["load_average_end"] = round(os.getloadavg()[0], 2)
    return res


def run(args: argparse.Namespace) -> int:
    res = run_on_loop(_bench(args))
    if not getattr(args, "json", False):
        print(
            f"{res['pipeline']}: ready {res['ready_s_spawn_median']} s spawned, "
            f"{res['ready_s_ray_median']} s on Ray; a node lost -> its replica back in "
            f"{res['node_loss_recovery_s_median']} s (median of {res['runs']}); "
            f"{res['lost_requests']} requests lost; load {res['load_average_start']} -> "
            f"{res['load_average_end']}"
        )
    print(json.dumps(res))
    return 1 if res["lost_requests"] else 0
