"""`manage.py audit`: check every live window's counters against the rows behind them, print
a table, and exit non-zero on drift (alerts/audit.py does the work)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from alerts.audit import AuditReport, audit_counters
from core.money import format_usd


def _usd(nano: int) -> str:
    """Exact to the nano-USD: a drift of one nano must show."""
    return format_usd(nano, exact=True)


class Command(BaseCommand):
    help = "Audit budget window counters against holds and applied usage; exit 1 on drift."

    def add_arguments(self, parser):
        parser.add_argument("--drift-only", action="store_true", help="list only windows that drift")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print the report as JSON")
        parser.add_argument(
            "--no-record",
            action="store_true",
            help="do not store the run or raise alerts (a dry look)",
        )

    def handle(
        self,
        *args,
        drift_only: bool = False,
        as_json: bool = False,
        no_record: bool = False,
        **options,
    ):
        report = audit_counters(record=not no_record)
        if as_json:
            self.stdout.write(_as_json(report))
        else:
            self._table(report, drift_only=drift_only)
        if not report.ok:
            windows = len({d.window_id for d in report.drifts})
            raise CommandError(
                f"counter drift in {windows} of {report.windows_checked} live windows; "
                f"{len(report.request_drifts)} requests recorded at other than their reported cost"
            )

    def _table(self, report: AuditReport, *, drift_only: bool) -> None:
        header = (
            f"{'window':>7}  {'budget':<32} {'spent':>20} {'expected':>20} {'reserved':>20} {'expected':>20}  status"
        )
        self.stdout.write(header)
        self.stdout.write("-" * len(header))
        for c in report.checks:
            if drift_only and c.ok:
                continue
            status = "ok" if c.ok else "DRIFT"
            self.stdout.write(
                f"{c.window_id:>7}  {c.budget_label[:32]:<32} {_usd(c.spent_nano):>20} "
                f"{_usd(c.expected_spent_nano):>20}"
                f" {_usd(c.reserved_nano):>20} {_usd(c.expected_reserved_nano):>20}  {status}"
            )
        for rd in report.request_drifts:
            self.stdout.write(
                f"request {rd.request_id}: recorded {_usd(rd.recorded_nano)}, reported {_usd(rd.reported_nano)}  DRIFT"
            )
        summary = (
            f"{report.windows_checked} live windows checked, "
            f"{len({d.window_id for d in report.drifts})} drifting; "
            f"{len(report.request_drifts)} requests off their reported cost"
        )
        self.stdout.write(self.style.SUCCESS(summary) if report.ok else self.style.ERROR(summary))


def _as_json(report: AuditReport) -> str:
    return json.dumps(
        {
            "ok": report.ok,
            "run_id": report.run_id,
            "windows_checked": report.windows_checked,
            "drifts": [d.as_dict() for d in report.drifts],
            "request_drifts": [d.as_dict() for d in report.request_drifts],
        },
        indent=2,
    )
