"""The usage record's wait at c=1: the group commit's statement sent from the event loop on its
own connection (gateway/upstream/loopdb.py) against the same statement on a settle thread.

    bash scripts/services.sh start
    .venv/bin/python bench/record.py [--records 2000] [--block 25]

One process, production settings, the gateway's own Recorder on one event loop. Every record
is awaited alone (one request at a time, as at c=1), for a reservation admitted beforehand under
one blocking organization cap. The two ways alternate in blocks of --block records, so both see
the same machine; the first block of each is left out (connections opening, the statement being
prepared). Prints the wait's p50, p90 and mean for each, and the difference.

Own database (capgate_bench_record, dropped and migrated first); nothing but Postgres on
127.0.0.1. About 20 seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gateway as bench  # noqa: E402 — env, fresh_database

DB = "capgate_bench_record"


def setup() -> None:
    bench.fresh_database(DB)
    os.environ.update(bench.env(DB))
    import django

    django.setup()


def admitted(n: int) -> list:
    # models and the ledger only once setup() has configured Django (the same in measure, main)
    from ledger.admission import AdmissionRequest, Subject, admit
    from ledger.models import Budget
    from tenants.models import ApiKey, Organization, Project

    org = Organization.objects.create(name="Record bench", slug="record-bench")
    project = Project.objects.create(organization=org, name="Main", slug="main")
    _, prefix, digest = ApiKey.generate()
    key = ApiKey.objects.create(organization=org, project=project, name="bench", prefix=prefix, key_hash=digest)
    Budget.objects.create(organization=org, scope="organization", mode="block", period="month", amount_nano=10**18)
    subject = Subject(organization_id=org.id, project_id=project.id, api_key_id=key.id)
    return [
        admit(request=AdmissionRequest(subject=subject, request_id=f"bench-{i}", worst_nano=1_000_000)).reservation
        for i in range(n)
    ]


async def measure(reservations: list, block: int) -> dict[bool, list[float]]:
    from django.conf import settings

    # after setup(), as in admitted
    from gateway.upstream.recorder import recorder
    from ledger.recording import Outcome

    waits: dict[bool, list[float]] = {True: [], False: []}
    rec = recorder()
    outcome = Outcome(status="served", cost_nano=500_000)
    blocks = [reservations[i : i + block] for i in range(0, len(reservations), block)]
    try:
        for n, chunk in enumerate(blocks):
            from_loop = n % 2 == 0
            settings.CAPGATE["LOOP_RECORDS"] = from_loop
            for reservation in chunk:
                started = time.perf_counter()
                await rec.record(reservation=reservation, outcome=outcome)
                if n >= 2:  # each way's first block warms its connection
                    waits[from_loop].append((time.perf_counter() - started) * 1000)
    finally:
        await rec.close()
    assert rec.loop_db.statements == sum(len(c) for n, c in enumerate(blocks) if n % 2 == 0)
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--block", type=int, default=25)
    args = parser.parse_args()
    setup()
    load = Path("/proc/loadavg").read_text().split()[0]
    reservations = admitted(args.records)
    waits = asyncio.run(measure(reservations, args.block))
    from ledger.models import UsageRecord  # after setup(), as in admitted

    assert UsageRecord.objects.count() == args.records  # every record written, once
    end_load = Path("/proc/loadavg").read_text().split()[0]
    print(f"# The usage record's wait at c=1 — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load {load} at start, {end_load} at end\n")  # fmt: skip
    print("| the statement sent | records | p50 ms | p90 ms | mean ms |")
    print("|---|---:|---:|---:|---:|")
    for from_loop, label in ((True, "from the event loop (loopdb)"), (False, "on a settle thread")):
        w = sorted(waits[from_loop])
        p50, p90, mean = statistics.median(w), w[int(len(w) * 0.9)], statistics.mean(w)
        print(f"| {label} | {len(w)} | {p50:.3f} | {p90:.3f} | {mean:.3f} |")
    saved = statistics.median(waits[False]) - statistics.median(waits[True])
    print(f"\nThe loop's statement saves {saved:.3f} ms of the record's p50 wait.")


if __name__ == "__main__":
    main()
