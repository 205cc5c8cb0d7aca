"""Only the ledger writes windows, reservations, holds, usage records and gateway processes.

A source scan, no database: every module outside `ledger/` (and migrations, tests, bench) is
parsed, and any ORM write on those models or raw SQL that inserts, updates or deletes their
tables is reported with its file and line. Row deletions the database cascades from a deleted
organization, project, member, key, end customer or budget are not writes of this code and are
not seen here (the tenants and budget deletion tests cover them).

The scan is a heuristic over names: a write is an ORM write method called on a chain that starts
at one of the models (`Window.objects....update()`), at a related manager of theirs
(`budget.windows....delete()`), at a variable assigned from one of those, at a parameter
annotated with one of the models, or at a model fetched with `apps.get_model`; or a string (or
f-string) with INSERT INTO / UPDATE / DELETE FROM on one of the tables, or on a `_meta.db_table`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"Window", "Reservation", "Hold", "UsageRecord", "GatewayInstance"}
GET_MODEL_NAMES = {"window", "reservation", "hold", "usagerecord", "gatewayinstance"}
RELATED = {"windows", "holds", "reservations", "usage_records"}
TABLES = ("budgets_window", "budgets_reservation", "budgets_hold", "usage_usagerecord", "budgets_gatewayinstance")
WRITES = {
    "create",
    "update",
    "delete",
    "bulk_create",
    "bulk_update",
    "get_or_create",
    "update_or_create",
    "save",
    "save_base",
}
SQL_WRITE = re.compile(
    r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(\s+TABLE)?)\s+\"?(" + "|".join(TABLES) + r")\b",
    re.I,
)
SQL_VERB = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s*$", re.I)
SKIP_DIRS = {
    ".venv",
    "tests",
    "bench",
    "migrations",
    "ledger",
    "node_modules",
    ".git",
    "var",
    "test-artifacts",
}

# Writers outside the ledger that are meant to be there, each with why. Keep this short.
ALLOWED: dict[str, str] = {}


def _sources() -> list[Path]:
    out = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if not SKIP_DIRS.intersection(rel.parts[:-1]):
            out.append(path)
    return sorted(out)


def _root(node: ast.AST) -> ast.AST:
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        else:
            return node


def _chain_attrs(node: ast.AST) -> list[str]:
    attrs = []
    while isinstance(node, ast.Call | ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute):
            attrs.append(node.attr)
        node = node.func if isinstance(node, ast.Call) else node.value
    return attrs


def _annotation_names(ann: ast.AST | None) -> set[str]:
    if ann is None:
        return set()
    return (
        {n.id for n in ast.walk(ann) if isinstance(n, ast.Name)}
        | {n.attr for n in ast.walk(ann) if isinstance(n, ast.Attribute)}
        | (
            {s for s in re.findall(r"\w+", ann.value)}
            if isinstance(ann, ast.Constant) and isinstance(ann.value, str)
            else set()
        )
    )


class _Scan(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.guarded: set[str] = set()  # variable names bound to a model, a queryset or a row

    def _is_guarded_expr(self, node: ast.AST) -> bool:
        root = _root(node)
        if isinstance(root, ast.Name) and (root.id in MODELS or root.id in self.guarded):
            return True
        if RELATED.intersection(_chain_attrs(node)):
            return True
        return self._is_get_model(node)

    def _is_get_model(self, node: ast.AST) -> bool:
        for call in ast.walk(node):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "get_model"
                and any(isinstance(a, ast.Constant) and str(a.value).lower() in GET_MODEL_NAMES for a in call.args)
            ):
                return True
        return False

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name) and self._is_guarded_expr(value):
            self.guarded.add(target.id)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
            if MODELS & _annotation_names(arg.annotation):
                self.guarded.add(arg.arg)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._bind(target, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value)
        if isinstance(node.target, ast.Name) and MODELS & _annotation_names(node.annotation):
            self.guarded.add(node.target.id)
        self.generic_visit(node)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self._bind(node.target, node.iter)
        self.generic_visit(node)

    visit_AsyncFor = visit_For  # type: ignore[assignment]

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._bind(node.target, node.iter)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute) and node.func.attr in WRITES and self._is_guarded_expr(node.func.value):
            self.found.append((node.lineno, f"ORM .{node.func.attr}() on {ast.unparse(node.func.value)[:80]}"))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and SQL_WRITE.search(node.value):
            self.found.append((node.lineno, f"SQL: {SQL_WRITE.search(node.value).group(0)}"))  # type: ignore[union-attr]

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        # f"UPDATE {model._meta.db_table} ...": a write on a table named at run time.
        text = ""
        for part in node.values:
            if isinstance(part, ast.Constant):
                text += str(part.value)
                continue
            expr = ast.unparse(part)
            if SQL_VERB.search(text) and "db_table" in expr and self._is_guarded_expr(part.value):
                self.found.append((node.lineno, f"SQL on a table named at run time: {expr[:60]}"))
            text += "{}"
        self.generic_visit(node)


def writes_in(source: str) -> list[tuple[int, str]]:
    scan = _Scan()
    scan.visit(ast.parse(source))
    return sorted(set(scan.found))


def outside_writers() -> list[str]:
    found = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        for line, what in writes_in(path.read_text(encoding="utf-8")):
            if f"{rel}:{what}" not in ALLOWED and rel not in ALLOWED:
                found.append(f"{rel}:{line}: {what}")
    return found


def test_only_the_ledger_writes_its_rows():
    assert outside_writers() == []


@pytest.mark.parametrize(
    "source",
    [
        "Window.objects.filter(id=1).update(spent_nano=0)",
        "UsageRecord.objects.bulk_create([])",
        "def f(r: Reservation):\n    r.delete()",
        "def f(r: 'Reservation | None'):\n    r.save()",
        "rec = UsageRecord.objects.get(pk=1)\nrec.save()",
        "for h in Hold.objects.all():\n    h.delete()",
        "budget.windows.all().delete()",
        "m = apps.get_model('usage', 'UsageRecord')\nm.objects.filter().update(cost_nano=0)",
        "m = apps.get_model('ledger', 'UsageRecord')\nm.objects.filter().update(cost_nano=0)",
        "GatewayInstance.objects.filter(pk=1).update(stopped_at=None)",
        "cursor.execute('UPDATE budgets_gatewayinstance SET heartbeat_at = now()')",
        "cursor.execute('UPDATE budgets_window SET spent_nano = 0')",
        'cursor.execute("""INSERT INTO budgets_hold (reservation_id) VALUES (1)""")',
        "cursor.execute('DELETE FROM \"usage_usagerecord\" WHERE id = 1')",
        "m = apps.get_model('usage', 'UsageRecord')\ncursor.execute(f'UPDATE {m._meta.db_table} SET subject = 1')",
        "cursor.execute(f'DELETE FROM {Hold._meta.db_table}')",
    ],
)
def test_the_scan_sees_each_kind_of_write(source):
    assert writes_in(source), source


@pytest.mark.parametrize(
    "source",
    [
        "UsageRecord.objects.filter(applied=False).exists()",
        "Budget.objects.create(name='x')",
        "cursor.execute('SELECT * FROM budgets_window FOR NO KEY UPDATE')",
        "job.save(update_fields=['state'])",
        "cursor.execute(f'UPDATE {AlertEvent._meta.db_table} SET sent = true')",
    ],
)
def test_the_scan_leaves_reads_and_other_tables_alone(source):
    assert writes_in(source) == []


def test_a_write_added_outside_the_ledger_fails_the_scan(tmp_path, monkeypatch):
    # given: the tree as it is, plus one module outside the ledger that bumps a window
    rogue = ROOT / "alerts" / "_rogue_writer_for_test.py"
    rogue.write_text(
        "from ledger.models import Window\n\n\ndef bump():\n    Window.objects.filter(id=1).update(spent_nano=0)\n",
        encoding="utf-8",
    )
    try:
        # then
        assert outside_writers() == ["alerts/_rogue_writer_for_test.py:5: ORM .update() on Window.objects.filter(id=1)"]
    finally:
        rogue.unlink()
