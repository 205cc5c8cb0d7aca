"""`manage.py capcheck`: run the four-property scenarios against a live capgate and print a table
per run; exit non-zero if any property fails (the capcheck package does the work).

Runs where it can reach the gateway over HTTP and read the gateway's database with its Django
settings (the same DATABASE_URL).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError, CommandParser

from capcheck import SCENARIOS, CapcheckError, Plan, RunReport, run_capcheck
from capcheck.kinds import CORE
from core.money import MoneyError, format_usd, usd_to_nano


def _usd(nano: int | None) -> str:
    """Exact to the nano-USD: a proof shows what the books hold, not a rounding of it."""
    return "-" if nano is None else format_usd(nano, exact=True)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def _money(text: str) -> int:
    try:
        amount = usd_to_nano(text)
    except MoneyError as exc:
        raise CommandError(f"'{text}': a USD amount {exc.message}") from None
    if amount <= 0:
        raise CommandError(f"'{text}' must be a positive USD amount")
    return amount


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise CommandError(f"'{text}' is not a comma-separated list of numbers") from None
    if not values or min(values) < 1:
        raise CommandError("concurrency must be one or more positive numbers")
    return values


def _marks(report: RunReport) -> str:
    return "  ".join(f"{n} {'ok' if ok else 'FAIL'}" for n, ok in report.properties.items())


class Command(BaseCommand):
    help = (
        "Prove the spend caps on a live capgate: for each scenario and concurrency, create a fresh "
        "organization with a $1 blocking cap, send N requests at once, wait for the drain, and check "
        "the four properties from the database. Exits 1 if any property fails."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--url",
            default=os.environ.get("CAPGATE_URL", "http://127.0.0.1:8000"),
            help="the gateway's base URL (default $CAPGATE_URL or http://127.0.0.1:8000)",
        )
        parser.add_argument(
            "--scenario",
            default="",
            help=f"comma-separated, from {','.join(SCENARIOS)},db-restart (default: all but db-restart)",
        )
        parser.add_argument(
            "--concurrency", default="50,200,500", help="requests sent at once per run (default 50,200,500)"
        )
        parser.add_argument("--cap-usd", default="1", help="the organization's blocking cap (default 1)")
        parser.add_argument("--key-cap-usd", default="0.30", help="multi: key A's daily cap (default 0.30)")
        parser.add_argument("--project-cap-usd", default="0.50", help="multi: the project cap (default 0.50)")
        parser.add_argument("--worst-usd", default="0.037", help="worst case reserved per request (default 0.037)")
        parser.add_argument("--actual-usd", default="0.012", help="what echo bills per request (default 0.012)")
        parser.add_argument("--delay-ms", type=int, default=100, help="echo's delay before answering (default 100)")
        parser.add_argument("--timeout", type=float, default=120.0, help="per-request client timeout, seconds")
        parser.add_argument(
            "--settle-timeout",
            type=float,
            default=60.0,
            help="how long to wait for the outbox to drain after a run, seconds (default 60)",
        )
        parser.add_argument(
            "--keep",
            action="store_true",
            help="leave the runs' keys and connections live (and print the keys); by default "
            "they are revoked/disabled. The runs' rows always stay: they are the record.",
        )
        parser.add_argument(
            "--restart-db-cluster",
            default="",
            metavar="DIR",
            help="run the db-restart scenario (alone, unless --scenario names others): stop and start the "
            "scripts/pg-cluster.sh cluster in DIR, which must be the one serving the gateway's database, "
            "mid-burst. Never done without this flag.",
        )
        parser.add_argument(
            "--restart-seconds", type=float, default=6.0, help="db-restart: how long the database stays down"
        )
        parser.add_argument(
            "--kind",
            default="echo",
            help="the connection kind the runs call (default echo, the built-in provider); any other kind "
            "calls --upstream-url, which must bill from X-Upstream-* headers (the fake provider), and runs "
            "the core scenarios (basic, stream, multi, failures) by default",
        )
        parser.add_argument("--upstream-url", default="", help="the provider's base URL for --kind")
        parser.add_argument(
            "--connection-secret-env",
            default="",
            metavar="VAR",
            help="the environment variable holding the --kind connection's secret",
        )
        parser.add_argument(
            "--connection-options", default="{}", help="the --kind connection's options, as a JSON object"
        )
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the reports as JSON")

    def handle(self, *args, **opts) -> None:
        cluster = opts["restart_db_cluster"]
        if cluster and not (Path(cluster) / "data" / "PG_VERSION").is_file():
            raise CommandError(
                f"--restart-db-cluster {cluster}: not a scripts/pg-cluster.sh cluster (no data/PG_VERSION)"
            )
        kind = opts["kind"]
        default = ",".join(SCENARIOS if kind == "echo" else CORE)
        scenario = opts["scenario"] or ("db-restart" if cluster else default)
        try:
            options = json.loads(opts["connection_options"])
        except ValueError:
            options = None
        if not isinstance(options, dict):
            raise CommandError("--connection-options: a JSON object")
        secret_env = opts["connection_secret_env"]
        if secret_env and secret_env not in os.environ:
            raise CommandError(f"--connection-secret-env: environment variable {secret_env} is not set")
        plan = Plan(
            url=opts["url"].rstrip("/"),
            scenarios=tuple(s.strip() for s in scenario.split(",") if s.strip()),
            restart_db_cluster=cluster,
            restart_seconds=opts["restart_seconds"],
            concurrency=_ints(opts["concurrency"]),
            cap_nano=_money(opts["cap_usd"]),
            key_cap_nano=_money(opts["key_cap_usd"]),
            project_cap_nano=_money(opts["project_cap_usd"]),
            worst_nano=_money(opts["worst_usd"]),
            actual_nano=_money(opts["actual_usd"]),
            delay_ms=opts["delay_ms"],
            request_timeout=opts["timeout"],
            settle_timeout=opts["settle_timeout"],
            keep=opts["keep"],
            kind=kind,
            upstream_url=opts["upstream_url"],
            connection_secret=os.environ[secret_env] if secret_env else "",
            connection_options=options,
        )
        as_json = opts["as_json"]
        try:
            reports = run_capcheck(plan=plan, progress=None if as_json else self._block)
        except CapcheckError as exc:
            raise CommandError(exc.message) from None
        if as_json:
            self.stdout.write(
                json.dumps(
                    {"url": plan.url, "ok": all(r.ok for r in reports), "runs": [r.as_dict() for r in reports]},
                    indent=2,
                )
            )
        else:
            self._summary(reports)
        failed = [r for r in reports if not r.ok]
        if failed:
            runs = ", ".join(f"{r.scenario}@{r.concurrency}" for r in failed)
            raise CommandError(
                f"a property failed (or the run proved nothing) in {len(failed)} of {len(reports)} runs: {runs}"
            )

    def _block(self, r: RunReport) -> None:
        w = self.stdout.write
        w(f"\n{r.scenario} · {r.concurrency} concurrent · org {r.organization}")
        w(f"  per request     worst case {_usd(r.worst_nano)} reserved, {_usd(r.actual_nano)} billed when served")
        w(f"  {'ceiling':<15} {'cap':>13} {'recorded':>13} {'counter':>13} {'peak held':>13} {'excess':>13}")
        for c in r.ceilings:
            w(
                f"  {c.label:<15} {_usd(c.amount_nano):>13} {_usd(c.booked_nano):>13} {_usd(c.spent_nano):>13} "
                f"{_usd(c.peak_nano):>13} {_usd(c.excess_nano):>13}  {'ok' if c.ok else 'OVER'}"
            )
        refused = sum(r.refused.values())
        w(
            f"  requests        {r.sent} sent: {r.served} served, {refused} refused, {r.failed} failed upstream, "
            f"{r.undelivered} without a response"
        )
        w("  refused by code " + (", ".join(f"{k} {v}" for k, v in sorted(r.refused.items())) or "-"))
        rows = ", ".join(f"{k} {v}" for k, v in sorted(r.records.items())) or "none"
        w(f"  usage rows      {sum(r.records.values())} ({rows}); {r.served_with_row} of {r.served} served have one")
        w(
            f"  left behind     {r.reservations_left} reservations, {r.holds_left} holds, {r.unapplied_left} "
            f"unapplied records; excess billed {_usd(r.excess_nano)}"
        )
        settled = "did NOT settle" if r.settle_s is None else f"settled {r.settle_s:.1f}s after the burst"
        w(f"  latency         p50 {_seconds(r.latency_p50_s)}, p95 {_seconds(r.latency_p95_s)}; {settled}")
        w(f"  properties      {_marks(r)}  -> " + ("PASS" if r.ok else "FAIL"))
        if r.inconclusive:
            w(f"    inconclusive: {r.inconclusive}")
        for p in r.problems[:20]:
            w(f"    {p}")
        if len(r.problems) > 20:
            w(f"    ... and {len(r.problems) - 20} more")
        if r.keys:
            w("  kept keys       " + ", ".join(f"{k}={v}" for k, v in sorted(r.keys.items())))

    def _summary(self, reports: list[RunReport]) -> None:
        w = self.stdout.write
        head = (
            f"{'scenario':<9} {'N':>4} {'cap':>13} {'recorded':>13} {'peak held':>13} {'served':>6} "
            f"{'refused':>7} {'failed':>6} {'rows':>5} {'left':>4} {'p50':>8} {'p95':>8}  properties 1-4"
        )
        w("\n" + head)
        w("-" * len(head))
        for r in reports:
            org = next((c for c in r.ceilings if c.label == "organization"), None)
            left = r.reservations_left + r.unapplied_left
            marks = " ".join("ok" if ok else "FAIL" for ok in r.properties.values())
            marks += "  (inconclusive)" if r.inconclusive else ""
            cap, booked, peak = (org.amount_nano, org.booked_nano, org.peak_nano) if org else (None, None, None)
            w(
                f"{r.scenario:<9} {r.concurrency:>4} {_usd(cap):>13} "
                f"{_usd(booked):>13} {_usd(peak):>13} {r.served:>6} "
                f"{sum(r.refused.values()):>7} {r.failed:>6} {sum(r.records.values()):>5} {left:>4} "
                f"{_seconds(r.latency_p50_s):>8} {_seconds(r.latency_p95_s):>8}  {marks}"
            )
        passed = sum(r.ok for r in reports)
        line = f"{passed} of {len(reports)} runs hold all four properties"
        w(self.style.SUCCESS(line) if passed == len(reports) else self.style.ERROR(line))
