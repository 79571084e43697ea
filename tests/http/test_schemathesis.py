"""``/openapi.json`` and the server agree: schemathesis, every check.

schemathesis reads the live server's document and sends what it
describes (schema-valid requests must be accepted), what it excludes
(schema-violating requests must be refused), methods it does not list,
and sequences that follow the links between routes; every response must
match its documented status, headers and schema.  Bounded examples, a
fixed seed: a failure here is reproducible with the ``curl`` line it
prints.

Own servers, with the default body limit: a schema cannot state a size
in bytes, so the shared test servers' small limit (413) would read as a
valid request refused.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from omnix.http.app import HttpServer
from omnix.pipelines.validate import parse_pipeline
from omnix.testing.serving import serve_scripted

from .conftest import IMAGE, OMNI, use_processes

pytest.importorskip("schemathesis")

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _schemathesis(server: HttpServer, max_examples: int) -> tuple[int, str]:
    # A subprocess: the CLI runs its own event loop and blocking client,
    # and this session's loop must keep serving meanwhile.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        server.url + "/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(max_examples),
        "--seed",
        "1",
        "--workers",
        "1",
        "--no-color",
        "--generation-database",
        "none",
        "--request-timeout",
        "20",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NO_COLOR": "1"},
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(errors="replace")


def _failures(output: str) -> str:
    """The report's failure section (its full output is long)."""
    start = output.find("=== FAILURES ===")
    end = output.find("=== SUMMARY ===")
    text = output[start:end] if start >= 0 else output[-4000:]
    return "\n".join(line[:300] for line in text.splitlines())[:8000]


@pytest.mark.timeout(180)
async def test_omni_server_agrees_with_its_openapi_document():
    # Chat (text and audio), speech (and its batch) and /metrics are published; images are not.
    async with serve_scripted(
        parse_pipeline(OMNI), processes=use_processes(), telemetry=True
    ) as server:
        rc, out = await _schemathesis(server, max_examples=15)
    assert rc == 0, _failures(out)
    assert "Tested: 18" in out, out[-2000:]  # 15 + GET /engines, a request's figures and trace.html


@pytest.mark.timeout(180)
async def test_image_server_agrees_with_its_openapi_document():
    # Images only (the pipeline makes no text or audio), no /metrics (no telemetry).
    async with serve_scripted(
        parse_pipeline(IMAGE), processes=use_processes(), telemetry=False
    ) as server:
        rc, out = await _schemathesis(server, max_examples=10)
    assert rc == 0, _failures(out)
    assert "Tested: 15" in out, out[-2000:]  # 12 + GET /engines, a request's figures and trace.html
