"""Two capgate workers that differ in one setting, against each other at c=1, interleaved.

    bash scripts/services.sh start
    .venv/bin/python bench/ab.py --env CAPGATE_LOOP_RECORDS=true,false [--system hot-run]
        [--rounds 12] [--seconds 2]

On this shared 2-core machine a c=1 latency moves by more between two bench/ratio.py runs than
most changes to the request path move it (docs/performance.md), because each system there gets
one cell, minutes apart. Here both workers (A with the first value, B with the second) and the
cap-less reference are up at once, and each round gives each of the three one short c=1 cell in
turn, A and B swapping places every round; the machine's drift falls on all three alike. The
report: each one's median over the rounds of its cells' p50, the median of the rounds' A − B
differences, and in how many rounds A was faster.

The systems, the upstream (one nginx worker's static reply) and the bench's own database are
bench/ratio.py's: `--system` picks which request both workers are sent (no-cap, hot-run,
hot-org). Ports 18300-18303, 127.0.0.1 only; every process started is stopped at the end, on
error too. Exits non-zero if any cell had an error or a non-2xx answer.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gateway as bench  # noqa: E402 — wait_http
from bench import ratio  # noqa: E402 — the systems, the database, nginx, wrk

B_PORT = 18303
SYSTEMS = {"no-cap": ratio.NO_CAP, "hot-run": ratio.HOT_RUN, "hot-org": ratio.HOT_ORG}


def parse_env(text: str) -> tuple[str, str, str]:
    """NAME=A,B as (NAME, A, B)."""
    name, sep, values = text.partition("=")
    a, comma, b = values.partition(",")
    if not sep or not comma or not name.isidentifier() or "," in b:
        raise argparse.ArgumentTypeError(f"expected NAME=A,B (two values), not {text!r}")
    return name, a, b


def order(round_number: int) -> tuple[str, ...]:
    """The cells of one round: the reference first, then A and B, swapping every round."""
    return ("reference", "A", "B") if round_number % 2 == 0 else ("reference", "B", "A")


def measure(args: argparse.Namespace, started: list[ratio.Service], nginx_dir: str) -> bool:
    name, a_value, b_value = args.env
    load_start = ratio.loadavg()
    ratio.setup(ratio.DB)
    Path(nginx_dir, "nginx.conf").write_text(ratio.nginx_config(nginx_dir))
    conf = ["/usr/sbin/nginx", "-p", nginx_dir, "-c", f"{nginx_dir}/nginx.conf", "-e", f"{nginx_dir}/error.log"]
    started.append(ratio.Service("nginx", conf, dict(os.environ)))
    started.append(ratio.Service("reference", ratio.uvicorn("bench.reference_proxy:app", ratio.REF_PORT), {
        **os.environ, "REFERENCE_UPSTREAM": f"http://127.0.0.1:{ratio.UP_PORT}"
    }))  # fmt: skip
    system = SYSTEMS[args.system]
    systems = {"reference": ratio.REFERENCE, "A": system, "B": dataclasses.replace(system, port=B_PORT)}
    for label, value in (("A", a_value), ("B", b_value)):
        env = {**ratio.environment(ratio.DB, pgbouncer=False, slices=True), name: value}
        started.append(
            ratio.Service(f"gateway-{label}", ratio.uvicorn("config.asgi:application", systems[label].port), env)
        )
    for label in ("A", "B"):
        bench.wait_http(f"http://127.0.0.1:{systems[label].port}/v1/models", {"authorization": f"Bearer {system.key}"})
    time.sleep(1)  # both past their startup
    for label in ("reference", "A", "B"):
        ratio.probe(systems[label])
        ratio.wrk(systems[label], 50, 2)  # pools, caches, the run's budget
    p50s: dict[str, list[float]] = {"reference": [], "A": [], "B": []}
    bad = 0
    for n in range(args.rounds):
        for label in order(n):
            cell = ratio.wrk(systems[label], 1, args.seconds)
            p50s[label].append(cell["p50"])
            bad += int(cell["errors"] + cell["non2xx"])
        print(f"round {n + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in p50s.items()), file=sys.stderr, flush=True)
    differences = [a - b for a, b in zip(p50s["A"], p50s["B"], strict=True)]
    print(
        f"# A/B at c=1 — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load_start} at start, "
        f"{ratio.loadavg()} at end\n\n"
        f"{system.label}; A: {name}={a_value}, B: {name}={b_value}; one capgate worker each, "
        f"config.settings.prod, slices on; {args.rounds} rounds of one {args.seconds} s c=1 cell each.\n"
    )
    print("| | median of the cells' p50 ms | fastest | slowest |")
    print("|---|---:|---:|---:|")
    for label, text in (
        ("reference", "cap-less reference"),
        ("A", f"A: {name}={a_value}"),
        ("B", f"B: {name}={b_value}"),
    ):
        values = p50s[label]
        print(f"| {text} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    faster = sum(d < 0 for d in differences)
    print(
        f"\nA − B, the median of the rounds' differences: {statistics.median(differences):+.2f} ms; "
        f"A was faster in {faster} of {len(differences)} rounds. Errors and non-2xx: {bad}."
    )
    return bad == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", type=parse_env, required=True, help="NAME=A,B: the setting and its two values")
    parser.add_argument("--system", choices=tuple(SYSTEMS), default="hot-run", help="the request both are sent")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=int, default=2, help="wrk duration per cell (at most 30)")
    args = parser.parse_args()
    args.seconds = max(1, min(args.seconds, 30))
    if not shutil.which("wrk") or not shutil.which("/usr/sbin/nginx"):
        raise SystemExit("wrk and nginx are needed: apt-get install wrk nginx (bench/ratio.py installs them)")
    (ROOT / "var").mkdir(exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started: list[ratio.Service] = []
    nginx_dir = tempfile.mkdtemp(prefix="capgate-ab-nginx-")
    try:
        ok = measure(args, started, nginx_dir)
    finally:
        for service in reversed(started):
            service.stop()
        shutil.rmtree(nginx_dir, ignore_errors=True)
    if not ok:
        raise SystemExit("some cells had errors or non-2xx answers")


if __name__ == "__main__":
    main()
