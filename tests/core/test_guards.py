"""Every guard point in the tree (core/guards.py): declared with the rule it enforces, and
switched off by at least one removal test."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from core.guards import Guards

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".venv", ".git", "node_modules", "var", "test-artifacts", "tests", "bench", "capgate.egg-info"}


def guard_modules() -> list[str]:
    """The dotted names of the modules that declare `GUARDS = Guards(...)` at top level."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if SKIP_DIRS & set(rel.parts):
            continue
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "GUARDS" for t in node.targets)
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "Guards"
            ):
                found.append(".".join(rel.with_suffix("").parts))
    return found


def _test_sources() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "tests").rglob("*.py")))


def test_every_guard_has_its_rule_and_a_removal_test():
    modules = guard_modules()
    assert len(modules) >= 13, modules  # the scan reads the tree
    tests = _test_sources()
    names: dict[str, str] = {}
    missing = []
    for dotted in modules:
        guards = importlib.import_module(dotted).GUARDS
        assert isinstance(guards, Guards), dotted
        for name in guards:
            assert name not in names, f"guard {name!r} of {dotted} is also {names[name]}'s: names must be unique"
            names[name] = dotted
            assert len(guards.rule(name).split()) >= 4, f"{dotted} GUARDS.{name} needs its rule in words"
            assert getattr(guards, name) is True, f"{dotted} GUARDS.{name} is off outside a removal test"
            switched_off = re.search(rf'setattr\(\s*[\w.]+\.GUARDS,\s*"{name}"', tests)
            if switched_off is None:
                missing.append(f"{dotted} GUARDS.{name}")
    assert not missing, "guards no test switches off:\n" + "\n".join(missing)


def test_no_module_keeps_a_loose_guard_flag():
    """Guard points live in GUARDS: a top-level `NAME = True` outside settings is reported."""
    loose = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if SKIP_DIRS & set(rel.parts) or rel.parts[0] == "config":
            continue
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign | ast.AnnAssign)
                and isinstance(node.value, ast.Constant)
                and node.value.value is True
            ):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                loose += [f"{rel}:{node.lineno} {t.id}" for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
    assert not loose, "module-level flags that look like guards (declare them in GUARDS):\n" + "\n".join(loose)


def test_a_guard_is_declared_with_its_rule_and_read_or_switched_by_name(monkeypatch):
    guards = Guards(keep="a rule in a few words")
    assert guards.keep is True and list(guards) == ["keep"] and guards.rule("keep") == "a rule in a few words"
    with pytest.raises(ValueError):
        Guards(bare="")
    with pytest.raises(AttributeError):
        guards.missing  # noqa: B018
    with pytest.raises(AttributeError):
        monkeypatch.setattr(guards, "missing", False)
    with monkeypatch.context() as patch:
        patch.setattr(guards, "keep", False)
        assert guards.keep is False
    assert guards.keep is True
