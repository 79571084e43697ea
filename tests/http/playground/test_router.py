"""The playground's routes: ``/`` redirects to ``/playground``; the page and
its files come from the package, answered without the API key (they hold
no data) and under a Content-Security-Policy that lets the page load and
call nothing but this server."""

from __future__ import annotations

from importlib import resources

import pytest

from omnix.http.playground.router import FILES

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_every_file_the_page_loads_ships_in_the_package():
    static = resources.files("omnix.http.playground").joinpath("static")
    assert sorted(FILES) == sorted(p.name for p in static.iterdir())


async def test_root_redirects_to_the_page(omni_server, http):
    async with http.get(omni_server.url + "/", allow_redirects=False) as r:
        assert r.status == 302
        assert r.headers["Location"] == "/playground"


async def test_the_page_and_its_files_need_no_key_and_load_nothing_from_elsewhere(key_server, http):
    url = key_server.url
    async with http.get(url + "/playground") as r:
        assert r.status == 200 and r.content_type == "text/html"
        page = await r.text()
        csp = r.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp and "unsafe-eval" not in csp
    assert "http://" not in page and "https://" not in page
    for name, kind in FILES.items():
        path = "/playground" if name == "index.html" else f"/playground/{name}"
        async with http.get(url + path) as r:
            assert r.status == 200, name
            assert r.content_type == kind
            assert r.headers["Content-Security-Policy"] == csp
            body = await r.text()
        assert "https://" not in body and "http://" not in body, name
    async with http.get(url + "/v1/models") as r:
        assert r.status == 401
