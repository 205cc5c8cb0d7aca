"""First-party imports live at the top of their module. One placed inside a function says why
on its line or just above it (an AppConfig.ready, an import cycle, a script that sets Django up
first, the one import against the layers); anything else is reported with its file and line."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = {
    "core",
    "tenants",
    "catalog",
    "ledger",
    "budgets",
    "alerts",
    "requestlog",
    "ratelimits",
    "gateway",
    "jobs",
    "echo",
    "capcheck",
    "dashboard",
    "config",
}
SKIP_DIRS = {".venv", ".git", "node_modules", "migrations", "tests", "var", "test-artifacts", "capgate.egg-info"}
# How far above a run of imports its comment may sit.
REACH = 3


def unexplained(source: str, where: str) -> list[str]:
    lines = source.split("\n")
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                module = child.module if isinstance(child, ast.ImportFrom) else child.names[0].name
                if module and module.split(".")[0] in APPS:
                    start = child.lineno - 1  # the first line of the run of imports it is in
                    while start > 0 and (
                        lines[start - 1].strip().startswith(("from ", "import ")) or not lines[start - 1].strip()
                    ):
                        start -= 1
                    near = lines[max(start - REACH, 0) : child.end_lineno]
                    if not any("#" in line for line in near):
                        found.append(f"{where}:{child.lineno} {lines[child.lineno - 1].strip()}")
            visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(ast.parse(source), False)
    return found


def test_the_scan_sees_an_unexplained_import():
    source = "def f():\n    from ledger.drain import drain\n    return drain\n"
    assert unexplained(source, "x.py") == ["x.py:2 from ledger.drain import drain"]
    explained = "def f():\n    # ledger.drain imports this module\n    from ledger.drain import drain\n"
    assert unexplained(explained, "x.py") == []


def test_every_function_level_import_says_why():
    found: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if SKIP_DIRS & set(rel.parts):
            continue
        found += unexplained(path.read_text(), str(rel))
    assert not found, "first-party imports inside functions without a reason (move them to the top):\n" + "\n".join(
        found
    )
