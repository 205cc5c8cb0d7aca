"""Where one capped request's time goes, step by step, without HTTP: the gateway's synchronous
steps called in sequence the way it calls them.

    bash scripts/services.sh start
    .venv/bin/python bench/gateway.py --only-reference --seconds 5   # creates capgate_bench_gw
    .venv/bin/python bench/hotpath.py [--requests 300]

For each step: this thread's CPU (time.thread_time: Python plus the driver, not the server),
wall time, and the statements it sends (Django's execute wrapper; BEGIN/COMMIT that psycopg adds
in a transaction are not counted). Steps: the request shape (JSON body to bounds), admit_call
(key, route, customer, run, budgets, limits, admission), the usage record, one drain of it. Uses
bench/gateway.py's database (its bench organization: one blocking organization cap). CPU is
what load does not inflate much; wall times on a busy machine mostly measure the scheduler.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
T = TypeVar("T")

BODY = {"model": "bench-up", "messages": [{"role": "user", "content": "Say hello in one word."}], "max_tokens": 64}
KEY = "cg_bench_key_0000000000000000"  # bench/gateway.py's bench organization


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument(
        "--no-slices",
        action="store_true",
        help="admit every request alone (no owning process, so no headroom slice; the default takes slices)",
    )
    args = parser.parse_args()
    from bench.gateway import env

    os.environ.update(env())
    import django

    django.setup()
    from django.db import connection

    # Imported after django.setup(): these import models, which need the app registry.
    from catalog.pricing import Usage
    from gateway.admission.bounds import SHAPERS
    from gateway.admission.service import admit_call
    from ledger import slices
    from ledger.drain import drain
    from ledger.instances import register
    from ledger.recording import Outcome, record

    owner_id = None if args.no_slices else register(name="bench-hotpath").id

    steps = ("shape", "admit_call", "record", "drain")
    cpu: dict[str, list[float]] = {s: [] for s in steps}
    wall: dict[str, list[float]] = {s: [] for s in steps}
    sent: dict[str, list[int]] = {s: [] for s in steps}
    count = [0]

    def counting(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        count[0] += 1
        return execute(sql, params, many, context)

    def step(name: str, fn: Callable[[], T]) -> T:
        c0, w0, n0 = time.thread_time(), time.perf_counter(), count[0]
        result = fn()
        cpu[name].append((time.thread_time() - c0) * 1000)
        wall[name].append((time.perf_counter() - w0) * 1000)
        sent[name].append(count[0] - n0)
        return result

    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    with connection.execute_wrapper(counting):
        for _ in range(args.requests):
            shape = step("shape", partial(SHAPERS["chat"], json.loads(json.dumps(BODY)), headers))
            _key, admission = step(
                "admit_call",
                partial(
                    admit_call,
                    raw_key=KEY,
                    shape=shape,
                    shape_error=None,
                    kind="chat",
                    request_id="hot_" + uuid.uuid4().hex,
                    customer_id=None,
                    run_id=None,
                    run_budget_usd=None,
                    owner_id=owner_id,
                    healthy=lambda _id: True,
                ),
            )
            outcome = Outcome(
                status="served",
                cost_nano=1000,
                usage=Usage(input_tokens=20, output_tokens=8),
                connection_id=admission.targets[0].connection.id,
            )
            step("record", partial(record, reservation=admission.reservation, outcome=outcome))
            slices.book.settled(admission.reservation)
            step("drain", partial(drain, limit=500))
            slices.book.retire_expired()  # the gateway does these two every 0.1 s, off the request path
            slices.book.give_back_pending()
    slices.book.retire_all()
    slices.book.give_back_pending()
    drain(limit=500)
    skip = args.requests // 10  # warm-up: caches, connections, first plans
    load = Path("/proc/loadavg").read_text().split()[0]
    print(
        f"{args.requests} requests, first {skip} skipped; load average {load} at the end; "
        f"{slices.book.admitted_from_slices} admitted from {slices.book.slices_taken} headroom slices\n"
    )
    print("| step | CPU p50 ms | wall p50 ms | statements |")
    print("|---|---:|---:|---:|")
    for s in steps:
        print(
            f"| {s} | {statistics.median(cpu[s][skip:]):.2f} | {statistics.median(wall[s][skip:]):.2f} | "
            f"{statistics.median(sent[s][skip:]):.0f} |"
        )
    total = sum(statistics.median(cpu[s][skip:]) for s in steps)
    print(f"| **total** | **{total:.2f}** | | |")


if __name__ == "__main__":
    main()
