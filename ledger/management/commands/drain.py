"""`manage.py drain`: apply the outbox now, as beat's `drain_usage` would (after a worker
outage, or to settle everything before reading the books)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from ledger.drain import drain_all
from ledger.recording import expire


class Command(BaseCommand):
    help = "Apply every unapplied usage record to its windows (and, with --expire, lapsed leases)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--expire",
            action="store_true",
            help="first charge reservations whose lease or deadline lapsed, at worst case",
        )

    def handle(self, *args, **options):
        expired = expire() if options["expire"] else 0
        applied = drain_all()
        # expire() applies its own records; `applied` counts the rest of the outbox.
        self.stdout.write(f"{expired} lapsed reservations charged at worst case, {applied} other records applied")
