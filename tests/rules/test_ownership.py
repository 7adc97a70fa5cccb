"""Parts own their state: no module writes an attribute of NodeAgent, Member or Daemon but their own, and message
bodies are read by key only in wire/ (every op has a record there, decoded once where its frame arrives)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # reads source files only

ELASTICD = Path(__file__).resolve().parents[2] / "elasticd"
# Each owner, its module, and how other modules name it (`self.node`, `d.member`, `self.d`, …): the last name of
# the written expression. A new alias for one of them is a new line here. Only the folders that may import them
# are read (tests/rules/test_import_direction.py): a coordinator's `node` is its NodeRecord, never the agent.
HOLDERS = ("member", "commands", "daemon", "cli")
OWNERS = {
    "NodeAgent": ("member/agent.py", {"node"}),
    "Member": ("member/link.py", {"member", "m"}),
    "Daemon": ("daemon/daemon.py", {"d", "daemon"}),
}


def assigned(tree: ast.AST) -> Iterator[ast.Attribute]:
    """Every attribute an assignment (plain, augmented, annotated, or in a tuple) writes."""
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        for target in targets:
            for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(element, ast.Attribute):
                    yield element


def own_attributes(module: str, cls: str) -> set[str]:
    tree = ast.parse((ELASTICD / module).read_text())
    owner = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    return {a.attr for a in assigned(owner) if isinstance(a.value, ast.Name) and a.value.id == "self"}


def last_name(expr: ast.expr) -> str:
    return expr.id if isinstance(expr, ast.Name) else expr.attr if isinstance(expr, ast.Attribute) else ""


def test_no_module_writes_the_attributes_of_the_node_agent_the_member_or_the_daemon() -> None:
    found = []
    for cls, (module, aliases) in OWNERS.items():
        attributes = own_attributes(module, cls)
        assert attributes, cls  # the scan sees the class
        for path in sorted(p for folder in HOLDERS for p in (ELASTICD / folder).rglob("*.py")):
            if path == ELASTICD / module:
                continue
            for write in assigned(ast.parse(path.read_text())):
                if write.attr in attributes and last_name(write.value) in aliases:
                    found.append(f"{path.relative_to(ELASTICD)}:{write.lineno}: {ast.unparse(write)} ({cls})")
    assert found == [], "give the owner a method that says the intent:\n" + "\n".join(found)


def test_the_scan_catches_a_write_from_another_module() -> None:
    snippet = "class Daemon:\n    def start(self):\n        self.node.worker_env = {}\n        m.leaving = True\n"
    writes = [(last_name(w.value), w.attr) for w in assigned(ast.parse(snippet))]
    assert writes == [("node", "worker_env"), ("m", "leaving")]


def test_message_bodies_are_read_by_key_only_in_wire() -> None:
    reads = [f"{path.relative_to(ELASTICD)}: {line.strip()}" for path in sorted(ELASTICD.rglob("*.py"))
             if "wire" not in path.relative_to(ELASTICD).parts
             for line in path.read_text().splitlines() for _ in re.finditer(r"\bbody(\.get\(|\[)", line)]
    assert reads == [], "a body read by key outside wire/: give its op a record"
