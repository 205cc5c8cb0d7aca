"""The leases runner's report (bench/admit/leases.py): its progress line, the throughput target
(N processes against pgbench at N clients, same run) and the exhaustion table."""

from __future__ import annotations

import argparse
from statistics import median

from bench.admit.exhaustion import Exhaustion
from bench.admit.leases import STOP_AFTER_REFUSALS


def _errors(errors: list[str]) -> str:
    """How many, and each kind once (a deadlock's first line)."""
    if not errors:
        return "–"
    kinds = sorted({e.split("DETAIL")[0].strip() for e in errors})
    return f"{len(errors)}: " + "; ".join(kinds)


def print_exhaustion(e: Exhaustion) -> None:
    print(
        f"  exhaustion slices {'on ' if e.slices_on else 'off'} {e.processes} processes: {e.admitted:,} admitted, "
        f"first refusal after {e.first_refusal_s:.1f} s at {e.at_refusal_pct:.2f}% of the cap, final "
        f"{e.final_pct:.2f}%, reserved {e.reserved}, {e.refused} refusals, {e.slices_taken} slices, "
        f"{e.elapsed:.1f} s  {e.check}" + (f"  errors: {e.errors[:2]}" if e.errors else ""),
        flush=True,
    )


# The throughput target: admissions/s at --leases-processes processes, as a multiple of pgbench's
# hot-row rate at as many clients in the same run (leases-cached is reported against it too).
TARGET_X = 3


def report_leases(results: dict, exhaustions: list[Exhaustion], args: argparse.Namespace) -> list[str]:
    """The leases target lines (N processes vs pgbench at N clients) and the exhaustion table."""
    out: list[str] = []
    for ceilings in args.ceilings:
        base = results.get((ceilings, args.leases_processes, "pgbench"))
        for runner in ("leases", "leases-cached"):
            cells = results.get((ceilings, args.leases_processes, runner))
            if not (base and cells):
                continue
            base_rate, rate = median(c.rate for c in base), median(c.rate for c in cells)
            verdict = "MET" if rate >= TARGET_X * base_rate else "NOT met"
            notes = "; ".join(sorted({c.note for c in cells}))
            out.append(
                f"Target ({ceilings} ceiling(s), {args.leases_processes} processes, >= {TARGET_X}x pgbench's hot-row "
                f"{base_rate:,.0f}/s = {TARGET_X * base_rate:,.0f}/s): {runner} {rate:,.0f} admissions/s = "
                f"{rate / base_rate:.2f}x -> **{verdict}** ({notes}; check {', '.join({c.check for c in cells})})."
            )
    if exhaustions:
        e0 = exhaustions[0]
        out += [
            "",
            f"Exhaustion: a cap of {e0.cap:,} nano-USD ({args.exhaust:,} worst cases of {e0.worst:,}), "
            f"{e0.processes} processes until each is refused {STOP_AFTER_REFUSALS} times in a row, every "
            f"admission settled at {e0.cost:,} ({args.exhaust_cost:g} x its worst case); 'at first refusal' "
            "= the spend of every admission that returned before the first refusal, as a share of the cap:",
            "",
            "| slices | admitted | first refusal after s | spend at first refusal | final spend | overshoot | "
            "reserved after | refusals | slices taken | in memory | run s | check | errors (retried) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for e in exhaustions:
            out.append(
                f"| {'on' if e.slices_on else 'off'} | {e.admitted:,} | {e.first_refusal_s:.1f} | "
                f"{e.at_refusal_pct:.2f}% | {e.spent:,} ({e.final_pct:.2f}%) | {max(e.spent - e.cap, 0):,} | "
                f"{e.reserved:,} | {e.refused:,} | {e.slices_taken:,} | "
                f"{e.from_slices / e.admitted if e.admitted else 0:.1%} | {e.elapsed:.1f} | {e.check} | "
                f"{_errors(e.errors)} |"
            )
        for e in exhaustions:
            if e.slices_on:
                met = e.at_refusal_pct >= 97 and e.spent <= e.cap and e.reserved == 0 and e.check == "ok"
                out.append(
                    f"Target (slices on: spend >= 97% of the cap at the first refusal, 0 overshoot, nothing left "
                    f"reserved): {e.at_refusal_pct:.2f}%, overshoot {max(e.spent - e.cap, 0)}, reserved "
                    f"{e.reserved} -> **{'MET' if met else 'NOT met'}**."
                )
    return out
