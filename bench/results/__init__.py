"""Benchmark results, one dated file per run (`<date>-<commit>-<bench>.md`), written by the
bench scripts themselves so the docs link to results instead of holding them."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent


def write_result(bench: str, args: str, table: str) -> Path:
    """Write one run's table with when, where and how it ran; returns the file's path."""
    root = HERE.parent.parent
    commit = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=False
        ).stdout.strip()
        or "unknown"
    )
    now = datetime.now(UTC)
    path = HERE / f"{now:%Y-%m-%d}-{commit}-{bench}.md"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    path.write_text(
        f"# bench/{bench}.py, {now:%Y-%m-%d %H:%M} UTC, commit {commit}\n\n"
        f"Arguments: `{args or '(defaults)'}`; {os.cpu_count()} cores; load average {load} at the end.\n\n"
        f"```\n{table}\n```\n"
    )
    return path
