"""The house's floors: which package of omnix may import which.

A package may import from its own package and from the floors below it,
never from a floor above nor from a neighbour on its own floor; product
code never imports test support (``omnix.testing``) or benchmarks
(``omnix.bench``); and no two modules import each other in a circle.
Lazy imports inside functions count the same as module-level ones: they
tie the layers just as hard.  docs/architecture.md draws the same picture.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "omnix"

#: floor number per top-level unit of ``omnix`` (a package or a module)
FLOORS: dict[str, int] = {
    "__init__": 0,
    "usage": 1,
    "events": 1,
    "pipelines": 2,
    "cli": 2,
    "transport": 3,
    "models": 3,
    "stages": 4,
    "orchestrator": 4,
    "engines": 5,
    "api": 5,
    "front": 5,
    "trace": 5,
    "telemetry": 6,
    "cluster": 6,
    "traceview": 6,
    "offline_cli": 6,
    "http": 7,
    "replay": 8,
    "testing": 9,
    "bench": 10,
}
NOT_PRODUCT = {"testing", "bench", "cli"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "omnix"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != "omnix":
                continue
            if target == "omnix":
                # ``from omnix import x``: x may be a submodule.
                found += [(node.lineno, f"omnix.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return found


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def test_every_unit_of_omnix_has_a_floor():
    units = {_unit(m) for m in _modules()}
    assert units <= set(FLOORS), f"give these a floor in FLOORS: {sorted(units - set(FLOORS))}"


def test_no_import_runs_up_the_floors_or_across_a_floor():
    modules = _modules()
    wrong: list[str] = []
    for name, path in modules.items():
        mine = _unit(name)
        for line, target in _imports(path):
            resolved = _resolve(target, modules)
            if resolved is None:
                continue
            theirs = _unit(resolved)
            if theirs == mine or theirs == "__init__":
                continue
            if FLOORS[theirs] >= FLOORS[mine]:
                wrong.append(
                    f"{path.relative_to(ROOT.parent)}:{line}: {mine} (floor {FLOORS[mine]}) imports "
                    f"{resolved} ({theirs}, floor {FLOORS[theirs]})"
                )
    assert not wrong, "imports against the floors:\n" + "\n".join(wrong)


def test_product_code_imports_no_test_support_or_benchmark():
    modules = _modules()
    wrong = [
        f"{path.relative_to(ROOT.parent)}:{line}: imports {target}"
        for name, path in modules.items()
        if _unit(name) not in NOT_PRODUCT
        for line, target in _imports(path)
        if _unit(target) in {"testing", "bench"}
    ]
    assert not wrong, "\n".join(wrong)


def test_no_modules_import_each_other_in_a_circle():
    modules = _modules()
    graph = {
        name: sorted({r for _, t in _imports(path) if (r := _resolve(t, modules)) and r != name})
        for name, path in modules.items()
    }
    # Package faces (__init__) hand names on; a submodule importing its own
    # package's face is not a circle of logic.
    for name in graph:
        graph[name] = [t for t in graph[name] if not name.startswith(t + ".")]
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                circles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in graph:
        if node not in state:
            visit(node)
    assert not circles, "modules in a circle:\n" + "\n".join(circles)


@pytest.mark.parametrize("unit", sorted(FLOORS))
def test_floor_names_a_real_part_of_omnix(unit):
    assert (ROOT / unit).is_dir() or (ROOT / f"{unit}.py").is_file()
