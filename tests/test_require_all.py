"""``OMNIX_REQUIRE_ALL=1`` (what .ci/run sets) turns a skip into a failure,
a module skipped at collection too; ``may_skip`` and xfail stay as they are.

Runs pytest on a scratch suite that has tests/conftest.py as its conftest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SUITE = """
import pytest

def test_passes():
    pass

@pytest.mark.skipif(True, reason="needs an engine that is not here")
def test_skipped_by_a_mark():
    pass

def test_skipped_inside():
    pytest.importorskip("no_such_module_omnix")

@pytest.mark.may_skip("a machine property, not a dependency")
@pytest.mark.skipif(True, reason="one CPU")
def test_may_skip():
    pass

@pytest.mark.xfail(strict=True, reason="a known finding")
def test_xfail():
    assert False
"""


def _pytest(tmp_path: Path, require_all: bool, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OMNIX_REQUIRE_ALL"}
    if require_all:
        env["OMNIX_REQUIRE_ALL"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_suite.py").write_text(SUITE)
    # This is the rootdir: the project's pytest settings do not apply.
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    return tmp_path


def test_outside_ci_a_skip_is_a_skip(suite: Path) -> None:
    run = _pytest(suite, False)
    assert run.returncode == 0, run.stdout
    assert "1 passed, 3 skipped, 1 xfailed" in run.stdout


def test_under_require_all_a_skip_fails_naming_its_reason(suite: Path) -> None:
    run = _pytest(suite, True)
    assert run.returncode == 1, run.stdout
    # A skip in setup (a mark) is reported as an error, one in the test body as a failure.
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error" in run.stdout
    assert "a skip fails: needs an engine that is not here" in run.stdout
    assert "a skip fails: could not import 'no_such_module_omnix'" in run.stdout
    assert "SKIPPED [1] test_suite.py" in run.stdout and "one CPU" in run.stdout


def test_under_require_all_a_module_skipped_at_collection_fails(suite: Path) -> None:
    (suite / "test_suite.py").write_text(
        'import pytest\npytest.importorskip("no_such_module_omnix")\n'
    )
    (suite / "test_other.py").write_text("def test_passes():\n    pass\n")
    assert _pytest(suite, False).returncode == 0
    run = _pytest(suite, True)
    assert run.returncode != 0
    assert "ERROR collecting test_suite.py" in run.stdout
    assert "a skip fails: could not import 'no_such_module_omnix'" in run.stdout
