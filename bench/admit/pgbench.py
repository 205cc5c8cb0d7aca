"""pgbench cells of the admission benchmark: the same admission SQL driven by pgbench on the same
Postgres (bench/pgbench/*.sql), the database's own limit on this machine; and the statement
signatures that match admit()'s trace to the script with the same statements."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

from bench.admit.base import PGBENCH_DIR, Db
from bench.admit.cell import Cell, check_reserved, cpu_ticks
from bench.admit.tenant import Tenant, close_db


def pgbench_script(ceilings: int, kind: str = "") -> Path:
    """kind "": the classic transaction; "full": with its two reads; "stmt": the one-statement engine."""
    return PGBENCH_DIR / f"admission_{ceilings}{'_' + kind if kind else ''}.sql"


def match_admit_script(tenant: Tenant) -> Path | None:
    """The script whose statements are admit()'s (compared by verb and table, in order)."""
    got = [signature(q) for q in tenant.admit_sql]
    for kind in ("stmt", "full"):
        path = pgbench_script(tenant.ceilings, kind)
        if path.exists() and script_signatures(path) == got:
            return path
    return None


def pgbench_defines(tenant: Tenant, worst: int) -> list[str]:
    d: dict[str, object] = {
        "org": tenant.org_id,
        "project": tenant.project_id,
        "key": tenant.key_id,
        "worst": worst,
    }
    for i, (w, b) in enumerate(zip(tenant.window_ids, tenant.budget_ids, strict=True), start=1):
        d[f"w{i}"] = w
        d[f"b{i}"] = b
    d["pstart"] = f"'{tenant.period_start.isoformat(sep=' ')}'::timestamptz"
    return [x for k, v in d.items() for x in ("-D", f"{k}={v}")]


def run_pgbench_cell(runner: str, tenant: Tenant, clients: int, args: argparse.Namespace, db: Db) -> Cell:
    cell = Cell(runner=runner, ceilings=tenant.ceilings, clients=clients)
    script: Path | None
    if runner == "pgbench-1stmt":
        script = PGBENCH_DIR / "admission_3_onestmt.sql"
    elif runner == "pgbench-admit":
        script = tenant.admit_script
        if script is None:
            cell.errors.append("no script in bench/pgbench has admit()'s statements (see the profile)")
            return cell
    else:
        script = pgbench_script(tenant.ceilings)
    close_db()
    with tempfile.TemporaryDirectory(prefix="capgate-pgbench-") as tmp:
        cmd = [
            args.pgbench,
            "-n",
            "-r",
            "-M",
            "simple",
            "-f",
            str(script),
            "-c",
            str(clients),
            "-j",
            str(clients),
            "-T",
            str(args.duration),
            "-l",
            "--log-prefix",
            f"{tmp}/tx",
            "-h",
            db.host,
            "-p",
            str(db.port),
            "-U",
            db.user,
            *pgbench_defines(tenant, args.worst_nano),
            db.name,
        ]
        env = {**os.environ, "PGPASSWORD": db.password}
        busy0, total0 = cpu_ticks()
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.duration + 120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            cell.errors.append(f"pgbench: {exc}")
            return cell
        busy1, total1 = cpu_ticks()
        if total1 > total0:
            cell.host_cpu_pct = 100.0 * (busy1 - busy0) / (total1 - total0)
        out = proc.stdout + proc.stderr
        tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
        processed = re.search(r"number of transactions actually processed: (\d+)", out)
        failed = re.search(r"number of failed transactions: (\d+)", out)
        if proc.returncode != 0 or not tps or not processed:
            cell.errors.append(f"pgbench exit {proc.returncode}: {out.strip()[-400:]}")
            return cell
        lat = []
        for log in Path(tmp).glob("tx*"):
            for line in log.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[2].isdigit():
                    lat.append(int(parts[2]) / 1e6)
        cell.latencies = sorted(lat)
        cell.count = int(processed.group(1))
        cell.elapsed = cell.count / float(tps.group(1)) if float(tps.group(1)) else 0.0
        # -r: mean latency per statement; the locking one, and what follows it (lock still held).
        stmts = re.findall(r"^\s+([\d.]+)\s+\d+\s+(\S.*)$", out.split("statement latencies", 1)[-1], re.MULTILINE)
        # (pgbench cuts the text at ~120 characters: recognise the locking statement by its start)
        locking = [
            k
            for k, (_ms, text) in enumerate(stmts)
            if text.startswith(('SELECT "budgets_window"."id"', "WITH l AS", "WITH ceilings"))
        ]
        if locking:
            k = locking[0]
            cell.lock_stmt_ms = float(stmts[k][0])
            cell.held_ms = sum(float(ms) for ms, _text in stmts[k + 1 :])
        if failed and int(failed.group(1)):
            cell.errors.append(f"{failed.group(1)} failed transactions")
    cell.check = check_reserved_pgbench(tenant, cell.count, args.worst_nano)
    return cell


def check_reserved_pgbench(tenant: Tenant, processed: int, worst: int) -> str:
    # pgbench's reservations carry the same organization, so the same check applies.
    return check_reserved(tenant, processed, worst)


def signature(sql: str) -> tuple[str, str]:
    """(verb, first table) of a statement: enough to compare admit() with the pgbench scripts."""
    s = sql.strip().strip('"').lstrip("(").strip()
    verb = s.split(None, 1)[0].upper() if s else ""
    m = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', s, re.IGNORECASE)
    return verb, (m.group(1) if m and verb not in ("BEGIN", "COMMIT") else "")


def script_signatures(path: Path) -> list[tuple[str, str]]:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith(("--", "\\")))
    return [signature(stmt) for stmt in text.split(";") if stmt.strip()]
