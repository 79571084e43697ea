"""What every test shares: in CI, a skipped test is not a pass.

Owns the ``OMNIX_REQUIRE_ALL`` switch (``.ci/run`` sets it to 1), the
``may_skip`` marker, and the ``starts_first`` marker (the order modules are
handed to pytest-xdist's workers in).  Under the switch a test that skips (a missing vLLM,
torch or diffusers, a missing ``prometheus`` binary, a trace absent from
the checkout, the in-process mode of the HTTP tests) fails instead, naming
its skip reason, and so does a module skipped while it is collected.  Only
a test marked ``@pytest.mark.may_skip("why")`` may still skip: one whose
need is no dependency omnix promises (a second CPU, a library only some
platforms ship).  Outside CI a skip stays a skip, so a laptop without the
engines can run the rest.  Also the session's loopback Ray cluster
(``ray_cluster``), which the Ray placement tests and the Kubernetes
manifests' test share (Ray's start is slow).  Does not own the skips themselves: each test
module says what it needs.
"""

from __future__ import annotations

import os

import pytest

from omnix.models.paths import ModelPaths

REQUIRE_ALL_ENV = "OMNIX_REQUIRE_ALL"


def require_all() -> bool:
    return os.environ.get(REQUIRE_ALL_ENV, "") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"may_skip(why): the test may skip even under {REQUIRE_ALL_ENV}=1 (CI); "
        "why says what it needs and why omnix does not promise it",
    )
    config.addinivalue_line(
        "markers",
        "starts_first: a module that runs for minutes; when modules run side by side "
        "(make test: pytest-xdist, a module to a worker) it is handed out first",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules marked ``starts_first`` first: the suite's wall time under
    ``-n`` is at least the time at which its longest module starts plus
    that module's own.  Then the modules that share one built-in server
    (the ``server`` fixture of tests/http/conftest.py, which keeps the
    two used last) one after another, where the first of them stands:
    each server starts once rather than once per return to it (a start
    is tens of seconds).  The rest keep their order."""
    modules: dict[object, int] = {}
    server_of: dict[object, str] = {}
    for item in items:
        module = getattr(item, "module", None)
        modules.setdefault(module, len(modules))
        if module is not None and "server" in getattr(item, "fixturenames", ()):
            name = getattr(module, "SERVER", None) or getattr(module, "PIPELINE", None)
            if isinstance(name, str):
                server_of.setdefault(module, name)
    first_of: dict[str, int] = {}
    for module, name in sorted(server_of.items(), key=lambda kv: modules[kv[0]]):
        first_of.setdefault(name, modules[module])

    def place(item: pytest.Item) -> tuple[bool, int, int]:
        module = getattr(item, "module", None)
        at = modules[module]
        name = server_of.get(module)
        return (
            item.get_closest_marker("starts_first") is None,
            first_of[name] if name is not None else at,
            at,
        )

    items.sort(key=place)


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _fail_the_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"skipped, and under {REQUIRE_ALL_ENV}=1 a skip fails: {_skip_reason(report)}\n"
        "(provide what it needs, or mark the test may_skip(why) where omnix does not promise it)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (
        report.skipped
        and not hasattr(report, "wasxfail")  # an xfail is reported as skipped too
        and require_all()
        and item.get_closest_marker("may_skip") is None
    ):
        _fail_the_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped and require_all():  # a module-level importorskip
        _fail_the_skip(report)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> ModelPaths:
    """The tiny models, built (or found) once for the session."""
    # Imported here: tests/test_require_all.py runs this file in a suite
    # of its own, where ``tests`` is no package.
    from tests.model_fixtures import session_models

    return session_models(tmp_path_factory)


@pytest.fixture(scope="session")
def ray_cluster():
    """A real Ray cluster on loopback for the session's Ray tests (its start
    is slow): a head with no CPU, a node offering ``thinker_node`` and two
    offering ``decoder_node``, one CPU each.  Shut down at the end (never
    ``ray stop``: that ends every Ray process on the host)."""
    from omnix.testing.ray_cluster import loopback_cluster

    with loopback_cluster([{"thinker_node": 1}, {"decoder_node": 1}, {"decoder_node": 1}]) as c:
        yield c
