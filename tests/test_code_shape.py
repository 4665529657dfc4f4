"""The package stays readable in pieces: no module over 600 lines, no function over 60.

A function may be longer when its docstring has a line that begins ``Long because`` and
says why (splitting it would scatter one argument over several places). Counted from the
source with ``ast`` (a function's lines include its docstring and nested functions).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "statebackend"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _long_functions(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            explained = any(line.strip().startswith("Long because") for line in doc.splitlines())
            if length > MAX_FUNCTION_LINES and not explained:
                out.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} "
                           f"({length} lines)")
    return out


def test_the_package_is_found():
    # a moved package must not turn the checks below into checks of nothing
    assert len(_modules()) > 50


def test_no_module_over_600_lines():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"modules over {MAX_FILE_LINES} lines (split them by concern): {long}"


def test_no_function_over_60_lines_without_a_reason():
    long = [f for p in _modules() for f in _long_functions(p)]
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines without a 'Long because' "
                      f"line in their docstring: {long}")
