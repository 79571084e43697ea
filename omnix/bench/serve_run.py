"""``omnix bench serve``'s run: which requests, when, how many at once.

Owns: the seeded plan of a run (each request's kind, drawn from ``--mix``,
and its prompt), Poisson arrivals at ``--request-rate``, the
``--concurrency`` bound, the speech mode probe, the model asked of
``GET /v1/models`` when none is given, the progress bar, and ``bench``,
which runs it all and returns the ``ServeBenchResult``.  Does not own a
request (``serve_client``) nor the figures (``serve_results``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from omnix.bench.serve_client import KINDS, Client, Kind
from omnix.bench.serve_results import RequestRecord, ServeBenchResult, summarize
from omnix.bench.serve_wire import http_error, models_decoder, one_line, unreachable

_WORDS = (
    (
        "the quick brown fox jumps over a lazy dog while seven bright stars shine "
        "above quiet rivers and distant mountains where travellers tell old stories "
        "about music, weather, gardens, trains, bridges, lanterns and small cities"
    )
    .replace(",", "")
    .split()
)


class BenchError(Exception):
    """The run cannot start (unreachable server, no model...): one line."""


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _kinds(args: argparse.Namespace) -> list[Kind]:
    if args.kind != "mix":
        return [args.kind]
    out: list[Kind] = []
    for name in args.mix.split(","):
        name = name.strip()
        if name not in KINDS:
            raise BenchError(f"--mix: unknown kind {name!r} (kinds: {', '.join(KINDS)})")
        out.append(name)
    if not out:
        raise BenchError("--mix names no kind")
    return out


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, words))).capitalize() + "."


class _Progress:
    """tqdm on stderr where installed, else a one-line counter."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.done = self.failed = 0
        self._bar: Any = None
        self._last = 0.0
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, file=sys.stderr, desc="requests", unit="req")

    def update(self, ok: bool) -> None:
        self.done += 1
        self.failed += not ok
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(1)
            if self.failed:
                self._bar.set_postfix(failed=self.failed, refresh=False)
            return
        now = time.monotonic()
        if now - self._last > 0.2 or self.done == self.total:
            self._last = now
            print(
                f"\r[bench serve] {self.done}/{self.total} requests, {self.failed} failed",
                end="\n" if self.done == self.total else "",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


async def _first_model(session: Any, base: str, headers: dict[str, str]) -> str:
    import aiohttp

    url = base + "/v1/models"
    try:
        async with session.get(url, headers=headers) as r:
            raw = await r.read()
            if r.status != 200:
                raise BenchError(f"GET {url}: {http_error(r.status, raw)}; pass --model")
    except aiohttp.ClientConnectorError as exc:
        raise BenchError(unreachable(base, exc)) from None
    except aiohttp.ClientError as exc:
        raise BenchError(one_line(f"GET {url}: {type(exc).__name__}: {exc}")) from None
    try:
        models = models_decoder.decode(raw)
    except msgspec.DecodeError:
        raise BenchError(f"GET {url}: not a model list; pass --model") from None
    if not models.data:
        raise BenchError(f"GET {url}: the server lists no model; pass --model")
    return models.data[0].id


async def bench(
    args: argparse.Namespace, on_progress: Callable[[RequestRecord], None] | None = None
) -> ServeBenchResult:
    """Run the benchmark ``args`` describes on the running loop."""
    import aiohttp

    base = _base_url(args.base_url)
    kinds = _kinds(args)
    if args.extra_body:
        try:
            if not isinstance(json.loads(args.extra_body), dict):
                raise ValueError("not an object")
        except ValueError as exc:
            raise BenchError(f"--extra-body must be a JSON object: {exc}") from None
    rng = random.Random(args.seed)
    plan = [
        (
            kinds[rng.randrange(len(kinds))] if len(kinds) > 1 else kinds[0],
            _prompt(rng, args.prompt_words),
        )
        for _ in range(args.num_prompts)
    ]
    rate = float(args.request_rate)
    gaps = [rng.expovariate(rate) if math.isfinite(rate) else 0.0 for _ in plan]
    limit = args.concurrency or 0
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    connector = aiohttp.TCPConnector(limit=limit)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        model = args.model or await _first_model(session, base, headers)
        client = Client(session, base, model, args)
        speech = ""
        if "speech" in {k for k, _ in plan}:
            if args.speech_stream == "auto":
                try:
                    client.speech_mode = await client.probe_speech()
                except aiohttp.ClientConnectorError as exc:
                    raise BenchError(unreachable(base, exc)) from None
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise BenchError(
                        one_line(f"speech probe: {type(exc).__name__}: {exc}")
                    ) from None
            else:
                client.speech_mode = args.speech_stream
            speech = client.speech_mode
        progress = _Progress(len(plan), not args.no_progress)
        sem = asyncio.Semaphore(limit) if limit else None
        t_run = time.perf_counter()

        async def one(i: int, kind: Kind, prompt: str) -> RequestRecord:
            if sem is None:
                rec = await client.send(i, kind, prompt, t_run)
            else:
                async with sem:
                    rec = await client.send(i, kind, prompt, t_run)
            progress.update(rec.ok)
            if on_progress is not None:
                on_progress(rec)
            return rec

        tasks = []
        try:
            for i, ((kind, prompt), gap) in enumerate(zip(plan, gaps, strict=True)):
                if gap > 0 and i > 0:
                    await asyncio.sleep(gap)
                tasks.append(asyncio.ensure_future(one(i, kind, prompt)))
            records = list(await asyncio.gather(*tasks))
        finally:
            for t in tasks:
                t.cancel()
            progress.close()
        duration = time.perf_counter() - t_run
    return summarize(args, base, model, kinds, speech, records, duration)
