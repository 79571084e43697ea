"""``omnix bench failover``: what a streaming client sees when the process
serving it dies.

Owns two measurements on the tiny text pipeline (greedy, so a continuation
must reproduce the undisturbed run exactly):

* Migration.  The thinker on two replicas, served by ``Omni`` in this
  process with real worker processes.  Each of ``--runs`` streamed requests
  is followed token by token; at a token drawn by this bench's own seeded
  RNG (``--seed``) the replica serving it is killed with SIGKILL.  The gap
  is what the client sees at the seam: the arrival of the continuation's
  first chunk (index K, ``Routed.resume == K``) minus the arrival of chunk
  K-1, the lost replica's last.  Before each run the bench waits until both
  replicas are ready again (the runtime restarts the killed one), so every
  kill has a spare replica ready.  ``migrations_ok`` counts runs that
  migrated and finished with exactly the undisturbed run's token ids and
  text.
* Restart-resume.  ``omnix serve --log-dir DIR`` in a subprocess, a
  streamed chat request over HTTP, SIGKILL of the server (its workers die
  with it) mid-stream, the same command again on DIR.  ``restart_resume_s``
  is from the restart to the first token the restarted server produced for
  that request, read through ``GET /v1/requests/{id}/stream`` with the
  ``Last-Event-ID`` the client last received (an SSE ``id:`` is a log
  position, so "produced after the restart" is a position past the log's
  length at the kill).  ``restart_ready_s`` (restart to "ready", the
  engine's load) is reported beside it: the target is ready + 2 s.

``--pipeline`` runs both on another one-stage text pipeline (the bench
gives its stage two replicas and retry for the migration): a scripted one
with a per-chunk delay runs the bench's own code in seconds.  A chunk
without token ids counts as one token.

Does not decide anything (the orchestrator does, from the log) nor measure
throughput (``omnix bench engines``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from omnix.bench.failover_pipeline import PROMPT, bench_pipeline, log_line
from omnix.bench.loop import run_on_loop
from omnix.bench.pipeline_arg import prepare_pipeline_models
from omnix.events.types import RequestSpec, Routed
from omnix.testing.served import ServeProcess
from omnix.testing.sse import chat_delta_text, sse_events
from omnix.usage import UsageError

# The restart request must still be running when the server is killed:
# ask for many tokens (greedy; the tiny model seldom stops early).
RESTART_MAX_TOKENS = 400


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=("local", "nats"),
        default="local",
        help="local: a replica's migration and a --log-dir restart; nats: a leader killed under "
        "clients of a frontend on a replicated log, a standby taking over (default local)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="migrations (local, default 20) or leader kills (nats, default 5) to measure",
    )
    parser.add_argument(
        "--streams", type=int, default=4, help="nats: streams through the frontend per kill"
    )
    parser.add_argument(
        "--ttft-requests",
        type=int,
        default=10,
        help="nats: requests whose time to first token is compared with the local log's",
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per migrated request")
    parser.add_argument(
        "--seed", type=int, default=17, help="seed of the bench's choice of kill points"
    )
    parser.add_argument("--model-dir", default=None, help="tiny models' folder (built if missing)")
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for a replica to be ready",
    )
    parser.add_argument("--skip-migration", action="store_true", help="measure the restart only")
    parser.add_argument("--skip-restart", action="store_true", help="measure migration only")
    parser.add_argument(
        "--pipeline",
        default=None,
        metavar="NAME|PATH",
        help="a one-stage text pipeline to run instead of the tiny thinker on vLLM (the bench "
        "gives its stage two replicas and retry; a scripted one with a delay makes a quick run)",
    )


# -- migration ---------------------------------------------------------------------


async def _until_ready(omni: Any, limit_s: float) -> float:
    """Seconds until every replica is ready (a killed one is restarted)."""
    t0 = time.perf_counter()
    await omni.wait_ready(limit_s, every_replica=True)
    return time.perf_counter() - t0


def _kill_serving(omni: Any, rid: str) -> int:
    """SIGKILL the replica the request runs on; its pid (0: none)."""
    state = omni.log.state
    for wid, ws in state.workers.items():
        if ws.alive and rid in state.requests_on(wid) and ws.pid:
            os.kill(ws.pid, signal.SIGKILL)
            return int(ws.pid)
    return 0


async def _stream(
    omni: Any, rid: str, kill_at: int = 0
) -> tuple[list[int], str, dict[int, float], int]:
    """Follow a request: its token ids, text, each chunk's arrival, and the
    pid killed once ``kill_at`` tokens came (0: none).  A chunk without
    token ids (a scripted engine's) counts as one token."""
    adm = omni.submit(RequestSpec(prompt=PROMPT, seed=1), request_id=rid)
    arrivals: dict[int, float] = {}
    ids: list[int] = []
    text: list[str] = []
    tokens = killed = 0
    async for out in omni.stream(adm.request_id):
        arrivals[out.index] = time.perf_counter()
        ids.extend(out.token_ids)
        text.append(out.text)
        tokens += len(out.token_ids) or 1
        if kill_at and not killed and tokens >= kill_at:
            killed = _kill_serving(omni, rid)
    return ids, "".join(text), arrivals, killed


async def _one_run(omni: Any, rid: str, kill_at: int, ref: tuple[list[int], str]) -> dict[str, Any]:
    ids, text, arrivals, killed = await _stream(omni, rid, kill_at)
    state = omni.state(rid)
    resumed = [ev.resume for ev in omni.log.events_for(rid) if type(ev) is Routed and ev.resume]
    seam = resumed[-1] if resumed else 0
    gap = None
    if seam and seam in arrivals and seam - 1 in arrivals:
        gap = (arrivals[seam] - arrivals[seam - 1]) * 1000.0
    exact = (ids, text) == ref
    ok = bool(killed and resumed and state.status == "finished" and exact and gap is not None)
    if not ok:
        log_line(
            f"{rid}: kill at {kill_at} (pid {killed}), resumed at {resumed}, status {state.status} "
            f"{state.reason!r}, exact {exact}"
        )
    return {"ok": ok, "gap_ms": gap, "kill_at": kill_at, "seam": seam}


async def _migration(args: argparse.Namespace) -> dict[str, Any]:
    from omnix.api import Omni

    cfg = bench_pipeline(args, args.max_tokens)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    async with Omni(cfg) as omni:
        await _until_ready(omni, args.ready_timeout)
        log_line(f"two replicas ready in {time.perf_counter() - t0:.1f} s")
        ids, text, arrivals, _ = await _stream(omni, "undisturbed")
        state = omni.state("undisturbed")
        status = state.status if state is not None else "unknown"
        tokens = len(ids) or len(arrivals)
        if status != "finished" or tokens < 8:
            raise RuntimeError(
                f"the undisturbed request {status} with {tokens} tokens: "
                "the bench needs at least 8 to kill in the middle"
            )
        ref = (ids, text)
        runs: list[dict[str, Any]] = []
        respawn: list[float] = []
        for i in range(args.runs):
            respawn.append(await _until_ready(omni, args.ready_timeout))
            kill_at = rng.randint(1, tokens - 4)
            runs.append(await _one_run(omni, f"failover-{i}", kill_at, ref))
            log_line(
                f"run {i}: kill at token {kill_at}, gap {runs[-1]['gap_ms']} ms, ok {runs[-1]['ok']}"
            )
    gaps = [r["gap_ms"] for r in runs if r["ok"]]
    return {
        "runs": args.runs,
        "migrations_ok": sum(r["ok"] for r in runs),
        "migrate_gap_p50_ms": round(statistics.median(gaps), 1) if gaps else None,
        "migrate_gap_max_ms": round(max(gaps), 1) if gaps else None,
        "replica_back_p50_s": round(statistics.median(respawn[1:]), 1)
        if len(respawn) > 1
        else None,
        "tokens_per_request": tokens,
    }


# -- restart-resume ----------------------------------------------------------------


async def _server(cfg: Path, log_dir: Path) -> ServeProcess:
    return await ServeProcess.start("--pipeline", str(cfg), "--log-dir", str(log_dir))


async def _restart(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="omnix-bench-failover-") as tmp:
        return await _restart_in(args, Path(tmp))


async def _restart_in(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import aiohttp

    from omnix.events.disklog import iter_log

    cfg = tmp / "pipeline.json"
    cfg.write_bytes(msgspec.json.encode(bench_pipeline(args, RESTART_MAX_TOKENS, replicas=1)))
    log_dir = tmp / "log"
    # resumable: the SSE events then carry the ids the resumed stream starts after.
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "stream_options": {"resumable": True},
    }
    timeout = aiohttp.ClientTimeout(total=args.ready_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        first = await _server(cfg, log_dir)
        try:
            await first.ready(args.ready_timeout)
            last_id, tokens = "", 0
            async with http.post(first.url + "/v1/chat/completions", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"chat request answered {r.status}: {await r.text()}")
                rid = r.headers["X-Request-Id"]
                async for event in sse_events(r.content):
                    last_id = event.id or last_id
                    tokens += bool(chat_delta_text(event.data))
                    if tokens >= 5:
                        break
                else:
                    raise RuntimeError("the request ended before the server could be killed")
                await first.kill9()
        finally:
            await first.close()
        logged = sum(1 for _ in iter_log(log_dir / "events"))
        log_line(f"killed the server after {tokens} tokens; {logged} events in its log")
        t0 = time.perf_counter()
        second = await _server(cfg, log_dir)
        ready: asyncio.Future[re.Match[str]] | None = None
        ready_at: list[float] = []
        try:
            listening = await second.until(r"listening on (http://\S+)", args.ready_timeout)
            second.url = listening.group(1)
            # Read the resumed stream from the moment the server listens, and
            # note when it says "ready" meanwhile.
            ready = asyncio.ensure_future(second.until(r"ready in [0-9.]+ s", args.ready_timeout))
            ready.add_done_callback(lambda _: ready_at.append(time.perf_counter()))
            first_new = await _first_new_token(http, second.url, rid, last_id, logged) - t0
            await ready
            ready_s = ready_at[0] - t0
        finally:
            if ready is not None and not ready.done():
                ready.cancel()
            await second.close()
    return {"restart_resume_s": round(first_new, 2), "restart_ready_s": round(ready_s, 2)}


async def _first_new_token(http: Any, base: str, rid: str, last_id: str, logged: int) -> float:
    """When the first token at a log position >= ``logged`` (appended by
    the restarted server) arrives on the request's resumed stream."""
    url = f"{base}/v1/requests/{rid}/stream"
    async with http.get(url, headers={"Last-Event-ID": last_id}) as r:
        if r.status != 200:
            raise RuntimeError(f"resumed stream answered {r.status}: {await r.text()}")
        async for event in sse_events(r.content):
            head = event.id.partition(".")[0]
            if head.isdigit() and int(head) >= logged and chat_delta_text(event.data):
                return time.perf_counter()
    raise RuntimeError("the resumed stream ended without a token from the restarted server")


# -- entry point ---------------------------------------------------------------------


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    # Builds what is missing and exports OMNIX_MODEL_DIR, which the
    # workers and the `omnix serve` subprocesses inherit.
    prepare_pipeline_models(bench_pipeline(args, args.max_tokens), args.model_dir)
    res: dict[str, Any] = {
        "load_average_start": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    if not args.skip_migration:
        res.update(await _migration(args))
    if not args.skip_restart:
        res.update(await _restart(args))
    res["load_average_end"] = round(os.getloadavg()[0], 2)
    return res


def _table(res: dict[str, Any]) -> None:
    if "migrations_ok" in res:
        print(
            f"migration (two replicas, kill -9 at a random token, {res['tokens_per_request']} tokens): "
            f"{res['migrations_ok']}/{res['runs']} exact; gap p50 {res['migrate_gap_p50_ms']} ms, "
            f"max {res['migrate_gap_max_ms']} ms (target p50 <= 500 ms); "
            f"a killed replica was ready again {res['replica_back_p50_s']} s (p50) after its run ended"
        )
    if "restart_resume_s" in res:
        print(
            f"server kill -9 and restart on its --log-dir: first resumed token after "
            f"{res['restart_resume_s']} s, ready after {res['restart_ready_s']} s "
            f"(target <= ready + 2 s)"
        )
    print(
        f"load average (1 min) {res['load_average_start']} at start, {res['load_average_end']} "
        f"at end, on {res['cpus']} CPUs"
    )


def run(args: argparse.Namespace) -> int:
    if args.runs is None:
        args.runs = 5 if args.backend == "nats" else 20
    for flag, value, least in (
        ("--runs", args.runs, 1),
        ("--max-tokens", args.max_tokens, 12),
        ("--streams", args.streams, 1),
        ("--ttft-requests", args.ttft_requests, 1),
    ):
        if value < least:
            raise UsageError(f"{flag} must be >= {least} (got {value})")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.backend == "nats":
        from omnix.bench import failover_nats

        res = run_on_loop(failover_nats.bench(args))
        failover_nats.table(res)
        if args.json:
            print(json.dumps(res))
        return 0 if res["lost_requests"] == 0 else 1
    res = run_on_loop(_bench(args))
    _table(res)
    if args.json:
        print(json.dumps(res))
    ok = res.get("migrations_ok", args.runs) == args.runs or args.skip_migration
    return 0 if ok else 1
