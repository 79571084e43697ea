"""``omnix serve PATH`` of a Moshi folder: the derived one-stage duplex
pipeline starts a real server whose ``moshi_duplex`` worker loads the model
and reports ready (the realtime duplex protocol that will drive it is later
work)."""

from __future__ import annotations

import aiohttp
import pytest

from omnix.testing.served import ServeProcess

pytestmark = [
    pytest.mark.engines,
    pytest.mark.timeout(300),
    pytest.mark.asyncio(loop_scope="function"),
]


async def test_serving_a_moshi_folder_starts_its_duplex_worker(tmp_path) -> None:
    from omnix.models.moshi import write_folder

    folder = tmp_path / "moshi"
    write_folder(folder, seed=0)
    served = await ServeProcess.start(str(folder), "--log-dir", str(tmp_path / "log"))
    try:
        url = await served.ready(timeout=240)
        await served.seen(r"worker duplex/0 ready: engine moshi_duplex", timeout=30)
        async with aiohttp.ClientSession() as http, http.get(url + "/ready") as r:
            assert r.status == 200
    finally:
        await served.stop()
