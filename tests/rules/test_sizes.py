"""Short files and short functions (Toolong, Frogmouth): no elasticd module over 400 lines, no function over 45."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # reads source files only

ELASTICD = Path(__file__).resolve().parents[2] / "elasticd"
MODULE_LINES, FUNCTION_LINES = 400, 45


def test_no_module_is_over_400_lines_and_no_function_over_45() -> None:
    long = []
    for path in sorted(ELASTICD.rglob("*.py")):
        source, where = path.read_text(), path.relative_to(ELASTICD)
        if (lines := len(source.splitlines())) > MODULE_LINES:
            long.append(f"{where}: {lines} lines")
        long += [f"{where}:{f.lineno} {f.name}: {f.end_lineno - f.lineno + 1} lines"
                 for f in ast.walk(ast.parse(source)) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                 and f.end_lineno - f.lineno + 1 > FUNCTION_LINES]
    assert long == [], "split by what the parts are, not to fit:\n" + "\n".join(long)
