"""Import direction: trainer_shim (torch + zmq) -> protocol <- elasticd (no textual) <- tui (no torch).

Read from the source with ast, so imports inside functions count too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

ROOT = Path(__file__).resolve().parent.parent
STDLIB = set(sys.stdlib_module_names)


def imports(package: str) -> dict[str, set[str]]:
    """Every module imported anywhere in a package's files, by file; each name as written."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def top(name: str) -> str:
    return name.split(".")[0]


# Only the optional integration modules may import the framework they connect, and nothing else may.
FRAMEWORKS = {"lightning", "pytorch_lightning", "transformers"}


def test_trainer_shim_imports_only_torch_zmq_and_the_protocol() -> None:
    for path, names in imports("trainer_shim").items():
        frameworks = FRAMEWORKS if path.startswith("trainer_shim/integrations/") else set()
        for name in names:
            allowed = top(name) in STDLIB | {"torch", "zmq", "numpy", "trainer_shim", "__future__"} | frameworks \
                or name == "elasticd.wire.protocol"
            assert allowed, f"{path} imports {name}"


def test_elasticd_never_imports_the_console_or_the_shim_and_torch_only_lazily() -> None:
    for path, names in imports("elasticd").items():
        assert not {top(n) for n in names} & {"textual", "tui", "trainer_shim", "plotext"}, path
    module_level = {
        str(path.relative_to(ROOT)): {a.name for node in ast.parse(path.read_text()).body
                                      if isinstance(node, ast.Import) for a in node.names}
        | {node.module for node in ast.parse(path.read_text()).body
           if isinstance(node, ast.ImportFrom) and node.module}
        for path in (ROOT / "elasticd").rglob("*.py")}
    for path, names in module_level.items():
        assert "torch" not in {top(n) for n in names}, f"{path} imports torch at module level"


def test_tui_never_imports_torch_or_the_shim() -> None:
    for path, names in imports("tui").items():
        assert not {top(n) for n in names} & {"torch", "trainer_shim"}, f"{path}: {names}"


def test_the_scan_sees_real_imports() -> None:
    """Guards the checks above against passing on an empty scan."""
    assert any(top(n) == "textual" for names in imports("tui").values() for n in names)
    assert any(top(n) == "zmq" for names in imports("trainer_shim").values() for n in names)
    assert any(n == "elasticd.wire.protocol" for names in imports("trainer_shim").values() for n in names)


def module_graph() -> dict[str, set[str]]:
    """Every product module and the product modules it imports, anywhere in the file (TYPE_CHECKING too)."""
    graph: dict[str, set[str]] = {}
    for package in ("elasticd", "tui", "trainer_shim"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found: set[str] = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    # `from pkg import mod` imports the submodule when there is one
                    found.update(f"{node.module}.{alias.name}" for alias in node.names)
                    found.add(node.module)
            graph[name] = found
    return {name: {n for n in found if n in graph and n != name} for name, found in graph.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                return [*path[path.index(dep):], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[name] = 2
        return []

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            return cycle
    return []


def test_no_import_cycle_among_product_modules() -> None:
    graph = module_graph()
    assert "elasticd.coordinator.coordinator" in graph["elasticd.daemon.daemon"]  # the scan sees real imports
    assert find_cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]

def test_tests_never_import_bench() -> None:
    """bench may use tests' support code (bench/chaos_soak.py runs tests/soak.py); tests never load bench code."""
    bench = {path.stem for path in (ROOT / "bench").glob("*.py")} | {"bench"}
    for path, names in imports("tests").items():
        assert not {top(n) for n in names} & bench, f"{path} imports {sorted({top(n) for n in names} & bench)}"
        if ROOT / path == Path(__file__).resolve():
            continue  # this guard names bench itself
        paths = [node.value for node in ast.walk(ast.parse((ROOT / path).read_text()))
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and (node.value == "bench" or node.value.startswith("bench/"))]
        assert not paths, f"{path} names a path under bench/: {paths}"  # a file loaded by path, importlib-style
