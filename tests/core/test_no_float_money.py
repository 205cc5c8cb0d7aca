"""No float in money: a scan of the source (everything but tests and migrations) for float
conversions of nano-USD and for nano/USD conversions written outside core/money.py."""

from __future__ import annotations

import re
from pathlib import Path

from core.env import BASE_DIR

SKIP_DIRS = {"tests", "migrations", ".venv", ".git", "node_modules", "var", "test-artifacts"}
# A float of money with a reason: Prometheus numbers are floats; the books stay integers.
ALLOWED = {("gateway/http/metrics.py", 'held.add_metric([row["organization__slug"]], float(nano_to_usd(')}

FLOAT_SCALE = re.compile(r"\b1e[-+]?9\b")  # the nano scale as a float: 1e9, 1e-9
# nano <-> USD written by hand: * or / by 10**9 or 1_000_000_000 (or a Decimal of it).
HAND_SCALE = re.compile(r"[*/]\s*(Decimal\()?\s*(10\s*\*\*\s*9|1_?000_?000_?000)\b")
MONEY = re.compile(r"nano|usd", re.IGNORECASE)


def floats_of_money(code: str) -> bool:
    """Whether a `float(...)` call on the line has money in its argument (balanced parentheses),
    so `float(args.duration)` beside a `worst_nano` is not flagged."""
    for match in re.finditer(r"\bfloat\(", code):
        depth, end = 1, match.end()
        while end < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[end], 0)
            end += 1
        if MONEY.search(code[match.end() : end]):
            return True
    return False


def offences(path: str, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        if any(path == p and snippet in line for p, snippet in ALLOWED):
            continue
        if FLOAT_SCALE.search(code):
            found.append(f"{path}:{number}: float scale: {line.strip()}")
        if floats_of_money(code):
            found.append(f"{path}:{number}: float of money: {line.strip()}")
        if path != "core/money.py" and HAND_SCALE.search(code):
            found.append(f"{path}:{number}: nano/USD by hand (use core.money): {line.strip()}")
    return found


def sources() -> list[Path]:
    return sorted(p for p in BASE_DIR.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(BASE_DIR).parts))


def test_no_float_or_hand_written_conversion_of_money_in_the_source():
    files = sources()
    assert any(p.relative_to(BASE_DIR).as_posix() == "core/money.py" for p in files)
    assert len(files) > 100  # the scan sees the tree, not an empty directory
    found = [o for p in files for o in offences(p.relative_to(BASE_DIR).as_posix(), p.read_text())]
    assert found == []


def test_the_scan_catches_each_kind():
    # the scanner must fail on what it exists to catch, or its passing means nothing
    bad = {
        "usd = cost_nano / 1e9": "float scale",
        'f"${spent / 1e9:.4f}"': "float scale",
        "amount_nano = int(float(text) * 1e9)": "float scale",
        "held = float(reserved_nano)": "float of money",
        "x = float(nano_to_usd(n))": "float of money",
        "usd = Decimal(n) / Decimal(10**9)": "by hand",
        "nano = int(amount * 1_000_000_000)": "by hand",
        "nano = int(amount * 10 ** 9)": "by hand",
    }
    for line, kind in bad.items():
        found = offences("alerts/example.py", line)
        assert len(found) >= 1 and kind in " ".join(found), line
    fine = [
        "latency = float(seconds)",
        "cap_nano: int = 1_000_000_000  # $1",
        "width = 1e3 * 2",
        "x = nano // NANO_PER_USD",
        "lat.append(int(parts[2]) / 1e6)",
        "common = (args.worst_nano, float(args.duration))",
    ]
    for line in fine:
        assert offences("alerts/example.py", line) == [], line
    # core/money.py itself may scale by hand; the allowed Prometheus line is allowed
    assert offences("core/money.py", "nano = amount * 1_000_000_000") == []
    path, snippet = next(iter(ALLOWED))
    assert offences(path, f"        {snippet}row['held'] or 0)))") == []
