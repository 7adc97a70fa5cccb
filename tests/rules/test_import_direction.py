"""Import direction: trainer_shim (torch + zmq) -> protocol, names <- elasticd (no textual) <- tui (no torch).

Read from the source with ast, so imports inside functions count too.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # no daemon, no subprocess: `make quick`

ROOT = Path(__file__).resolve().parents[2]
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


# The wire's stdlib-only modules: the envelope and codec, and the ops' names.
SHIM_WIRE = {"elasticd.wire.protocol", "elasticd.wire.names"}


def test_trainer_shim_imports_only_torch_zmq_and_the_wire() -> None:
    for path, names in imports("trainer_shim").items():
        frameworks = FRAMEWORKS if path.startswith("trainer_shim/integrations/") else set()
        for name in names:
            allowed = top(name) in STDLIB | {"torch", "zmq", "numpy", "trainer_shim", "__future__"} | frameworks \
                or name in SHIM_WIRE
            assert allowed, f"{path} imports {name}"


def test_elasticd_never_imports_the_console_or_the_shim_and_torch_only_lazily() -> None:
    for path, names in imports("elasticd").items():
        assert not {top(n) for n in names} & {"textual", "tui", "trainer_shim", "plotext", "support"}, path
    module_level = {
        str(path.relative_to(ROOT)): {a.name for node in ast.parse(path.read_text()).body
                                      if isinstance(node, ast.Import) for a in node.names}
        | {node.module for node in ast.parse(path.read_text()).body
           if isinstance(node, ast.ImportFrom) and node.module}
        for path in (ROOT / "elasticd").rglob("*.py")}
    for path, names in module_level.items():
        assert "torch" not in {top(n) for n in names}, f"{path} imports torch at module level"


def test_tui_never_imports_torch_or_the_shim() -> None:
    """Nor the tests' support (tests/support/): its fake jobs are test doubles, no longer in the package."""
    for path, names in imports("tui").items():
        assert not {top(n) for n in names} & {"torch", "trainer_shim", "support"}, f"{path}: {names}"


def test_the_scan_sees_real_imports() -> None:
    """Guards the checks above against passing on an empty scan."""
    assert any(top(n) == "textual" for names in imports("tui").values() for n in names)
    assert any(top(n) == "zmq" for names in imports("trainer_shim").values() for n in names)
    assert {n for names in imports("trainer_shim").values() for n in names} >= SHIM_WIRE


def test_the_wire_modules_the_shim_imports_import_only_the_stdlib() -> None:
    for name in SHIM_WIRE:
        path = f"{name.replace('.', '/')}.py"
        assert {top(n) for n in imports("elasticd")[path]} <= STDLIB | {"__future__"}, path


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def discovered(tree: ast.Module, path: Path) -> set[str]:
    """Modules a file imports by discovery: `pkgutil.iter_modules(pkg.__path__)` with `pkg` imported by name."""
    aliases = {alias.asname or alias.name: f"{node.module}.{alias.name}" for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
    found: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "iter_modules"
                and node.args and isinstance(node.args[0], ast.Attribute)
                and isinstance(node.args[0].value, ast.Name) and node.args[0].value.id in aliases):
            package = aliases[node.args[0].value.id]
            folder = ROOT.joinpath(*package.split("."))
            found.update(f"{package}.{child.stem}" for child in folder.glob("*.py") if child.stem != "__init__")
    assert not ("iter_modules" in path.read_text() and not found), f"{path}: a discovery the scan cannot follow"
    return found


def module_graph() -> dict[str, set[str]]:
    """Every product module and the product modules it imports, anywhere in the file (TYPE_CHECKING too), and
    the modules it imports by discovery (the verb registry)."""
    graph: dict[str, set[str]] = {}
    for package in ("elasticd", "tui", "trainer_shim"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            found = discovered(tree, path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    # `from pkg import mod` imports the submodule when there is one
                    found.update(f"{node.module}.{alias.name}" for alias in node.names)
                    found.add(node.module)
            graph[module_name(path)] = found
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

# elasticd's folders by side, lowest first: a module imports only from its own folder or those before it
# (docs/architecture.md draws the same tree). `elasticd` itself (its version) is below them all.
SIDES = ("wire", "job", "keys", "mesh", "coordinator", "member", "client", "commands", "daemon", "cli")


def side_of(module: str) -> int:
    """Where an elasticd module stands among SIDES; -1 for the package itself."""
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    assert parts[1] in SIDES, f"{module} is in no side of elasticd: add its folder to SIDES and to the docs"
    return SIDES.index(parts[1])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of an elasticd module from a folder above the importer's."""
    return sorted(f"{name} -> {dep}" for name, deps in graph.items() if name.startswith("elasticd")
                  for dep in deps if dep.startswith("elasticd") and side_of(dep) > side_of(name))


def test_every_elasticd_module_imports_only_its_own_side_or_those_below() -> None:
    graph = module_graph()
    assert len({side_of(name) for name in graph if name.startswith("elasticd")}) == len(SIDES) + 1
    assert upward_imports(graph) == []


def test_the_direction_check_finds_an_upward_import() -> None:
    graph = {"elasticd.wire.names": {"elasticd.wire.protocol"}, "elasticd.coordinator.rounds": {"elasticd.wire.names"},
             "elasticd.member.agent": {"elasticd.daemon.daemon", "elasticd.coordinator.rounds"},
             "elasticd.daemon.daemon": {"elasticd.member.agent"}}
    assert upward_imports(graph) == ["elasticd.member.agent -> elasticd.daemon.daemon"]


def test_a_module_in_no_side_is_named() -> None:
    with pytest.raises(AssertionError, match=r"elasticd\.misc\.thing is in no side"):
        upward_imports({"elasticd.misc.thing": {"elasticd.wire.names"}})


def test_the_verb_registry_counts_as_importing_every_verb() -> None:
    """Discovery is an import: a verb that imported the registry back would be a circle the scan must see."""
    graph = module_graph()
    verbs = {name for name in graph if name.startswith("elasticd.commands.verbs.")}
    assert {"elasticd.commands.verbs.drain", "elasticd.commands.verbs.scale"} <= verbs
    assert verbs <= graph["elasticd.commands.registry"]
    assert find_cycle({**graph, "elasticd.commands.verbs.drain": {"elasticd.commands.registry"}})


PRODUCT = ("elasticd", "tui", "trainer_shim")


def module_path(name: str) -> Path | None:
    """The file of a product module or package; None for anything else (the standard library, Textual...)."""
    if name.split(".")[0] not in PRODUCT:
        return None
    base = ROOT.joinpath(*name.split("."))
    return next((path for path in (base / "__init__.py", base.with_suffix(".py")) if path.is_file()), None)


def executed_imports(statements: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run as a module loads: not those in functions, nor under `if TYPE_CHECKING:`."""
    for node in statements:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            yield from executed_imports(node.orelse)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):  # a class body, if, try, with: they run
            for block in ("body", "orelse", "finalbody", "handlers"):
                yield from executed_imports(getattr(node, block, []))


def with_packages(names: list[str]) -> set[str]:
    """Each module and every package above it: a package's __init__ runs before its modules."""
    return {".".join(name.split(".")[:depth]) for name in names for depth in range(1, name.count(".") + 2)}


def imported(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> set[str]:
    if isinstance(node, ast.Import):
        return with_packages([alias.name for alias in node.names])
    base = node.module or ""
    if node.level:  # relative: from the importer's package, one level up per extra dot
        package = (importer if is_package else importer.rpartition(".")[0]).split(".")
        base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
    return with_packages([base, *(f"{base}.{alias.name}" for alias in node.names)])  # `from pkg import module`


def loaded_by(*roots: str) -> set[str]:
    """The product modules that importing `roots` loads, following the imports that run at load time."""
    loaded: set[str] = set()
    pending = with_packages(list(roots))
    while pending:
        name = pending.pop()
        path = module_path(name)
        if name in loaded or path is None:
            continue
        loaded.add(name)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text())
        pending |= {found for node in executed_imports(tree.body) for found in imported(node, name, is_package)}
        pending |= discovered(tree, path)  # the registry loads every verb as it loads
    return loaded


def test_the_console_loads_no_daemon_side_module() -> None:
    """The console reads the verb registry, and the verbs run against commands/port.py's JobPort: loading the
    console loads no coordinator, member, daemon or mesh module."""
    loaded = loaded_by("tui.app", "tui.cli")
    assert {"elasticd.client", "elasticd.commands.port", "elasticd.commands.verbs.drain"} <= loaded  # a real scan
    sides = {"elasticd.coordinator", "elasticd.member", "elasticd.daemon", "elasticd.mesh"}
    assert sorted(name for name in loaded if ".".join(name.split(".")[:2]) in sides) == []


def test_the_load_scan_skips_functions_and_type_checking() -> None:
    source = "import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\ndef f():\n    import d\n" \
             "class K:\n    import e\ntry:\n    import g\nexcept ImportError:\n    import h\n"
    found = {alias.name for node in executed_imports(ast.parse(source).body) for alias in node.names}
    assert found == {"a", "c", "e", "g", "h"}


def test_tests_never_import_bench() -> None:
    """bench may use tests' support code (bench/chaos_soak.py runs tests/support/soak.py); tests never load bench
    code."""
    bench = {path.stem for path in (ROOT / "bench").glob("*.py")} | {"bench"}
    for path, names in imports("tests").items():
        assert not {top(n) for n in names} & bench, f"{path} imports {sorted({top(n) for n in names} & bench)}"
        if ROOT / path == Path(__file__).resolve():
            continue  # this guard names bench itself
        paths = [node.value for node in ast.walk(ast.parse((ROOT / path).read_text()))
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and (node.value == "bench" or node.value.startswith("bench/"))]
        assert not paths, f"{path} names a path under bench/: {paths}"  # a file loaded by path, importlib-style
