"""No module outside gateway/upstream/proxy.py uses a `_name` of it: neither a private member of
`ProxyCall` (its public interface is in its docstring) nor a private name of the module.

A source scan, no database: every first-party module (tests included) is parsed; an import of a
private name from the proxy, an attribute `_x` of a name bound to the proxy module, or an
attribute named like one of ProxyCall's private members is reported with its file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "gateway" / "upstream" / "proxy.py"
MODULE = "gateway.upstream.proxy"
SKIP_DIRS = {".venv", ".git", "node_modules", "var", "test-artifacts", "capgate.egg-info"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def proxy_private_names() -> tuple[set[str], set[str]]:
    """ProxyCall's private members (methods and `self._x` attributes) and the module's private names."""
    tree = ast.parse(PROXY.read_text())
    members: set[str] = set()
    module: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and _private(node.name):
            module.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            module |= {t.id for t in targets if isinstance(t, ast.Name) and _private(t.id)}
        if isinstance(node, ast.ClassDef) and node.name == "ProxyCall":
            for item in ast.walk(node):
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and _private(item.name):
                    members.add(item.name)
                if (
                    isinstance(item, ast.Attribute)
                    and isinstance(item.value, ast.Name)
                    and item.value.id == "self"
                    and _private(item.attr)
                ):
                    members.add(item.attr)
    return members, module


def violations(source: str, members: set[str], where: str = "<source>") -> list[str]:
    tree = ast.parse(source)
    aliases: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == MODULE:
            found += [f"{where}:{node.lineno} imports {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module == "gateway.upstream":
            aliases |= {a.asname or a.name for a in node.names if a.name == "proxy"}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == MODULE and a.asname}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        if isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append(f"{where}:{node.lineno} uses proxy.{node.attr}")
        elif node.attr in members:
            found.append(f"{where}:{node.lineno} uses ProxyCall.{node.attr}")
    return found


def test_the_scan_sees_private_use():
    members, module = proxy_private_names()
    assert members and module, "the scan found no private names in proxy.py: it reads nothing"
    member = sorted(members)[0]
    source = (
        "from gateway.upstream import proxy\n"
        "from gateway.upstream.proxy import ProxyCall, _loads\n"
        f"proxy._wait_disconnect(req)\ncall.{member}\ncall.request_id\n"
    )
    assert len(violations(source, members)) == 3


def test_nothing_outside_the_proxy_uses_its_private_names():
    members, _ = proxy_private_names()
    found: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if path == PROXY or SKIP_DIRS & set(rel.parts):
            continue
        found += violations(path.read_text(), members, str(rel))
    assert not found, "private names of gateway/upstream/proxy.py used outside it:\n" + "\n".join(found)
