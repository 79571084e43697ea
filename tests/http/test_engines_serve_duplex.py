"""``omnix serve PATH`` of a Moshi folder: the derived one-stage duplex
pipeline starts a real server whose ``moshi_duplex`` worker loads the model
and reports ready; the worker killed with SIGKILL is recorded lost and
started again, and the server answers ready once more (a client's view:
tests/http/realtime/test_engines_duplex.py, and of the server's SIGKILL
mid-session: test_engines_duplex_restart.py)."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import aiohttp
import psutil
import pytest

from omnix.testing.served import ServeProcess

pytestmark = [
    pytest.mark.engines,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="function"),
]


async def test_serving_a_moshi_folder_starts_its_duplex_worker_and_again_after_a_sigkill(
    tmp_path,
) -> None:
    from omnix.models.moshi import write_folder

    folder = tmp_path / "moshi"
    write_folder(folder, seed=0)
    served = await ServeProcess.start(str(folder), "--log-dir", str(tmp_path / "log"))
    try:
        url = await served.ready(timeout=240)
        await served.seen(r"worker duplex/0 ready: engine moshi_duplex", timeout=30)
        async with aiohttp.ClientSession() as http, http.get(url + "/ready") as r:
            assert r.status == 200

        (worker,) = [
            p
            for p in psutil.Process(served.proc.pid).children(recursive=True)
            if "worker_cli" in " ".join(p.cmdline()) and "duplex" in p.cmdline()
        ]
        os.kill(worker.pid, signal.SIGKILL)
        await served.seen(r"lost duplex/0", timeout=60)
        ready = r"worker duplex/0 ready: engine moshi_duplex"
        async with asyncio.timeout(180):
            while sum(bool(re.search(ready, line)) for line in served.lines) < 2:  # noqa: ASYNC110 (the process's output offers no event per line)
                await asyncio.sleep(0.2)
        async with aiohttp.ClientSession() as http, http.get(url + "/ready") as r:
            assert r.status == 200 and (await r.json())["stages"] == {"duplex": 1}
    finally:
        await served.stop()
