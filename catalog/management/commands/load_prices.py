"""manage.py load_prices [--file PATH] [--overwrite] [--dry-run | --check]: load the price catalog.

By default the catalog is today's prices from genai-prices (catalog/genai.py) with capgate's own
file filling in limits and the models genai-prices lacks; --file loads one price file alone.
"""

import sys
from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from catalog.genai import Skipped, genai_catalog, source
from catalog.prices import (
    DEFAULT_CATALOG_PATH,
    CatalogError,
    LoadResult,
    ModelChange,
    load_catalog,
    read_catalog,
)

_SHOWN_ON_CREATE = (
    "input",
    "output",
    "cache_read",
    "cache_write",
    "max_output_tokens",
    "context_window",
    "max_image_tokens",
)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    if isinstance(value, list):
        return "[" + "; ".join(", ".join(f"{k} {v}" for k, v in item.items()) for item in value) + "]"
    return str(value)


class Command(BaseCommand):
    help = (
        "Load model prices and limits: by default today's prices from genai-prices (models it prices in a "
        "shape capgate cannot bound are listed as skipped, with the reason), with limits and extra models "
        "from catalog/data/prices.json; or one catalog file with --file. New models are created; fields "
        "nobody edited follow the catalog; fields an operator edited are kept unless --overwrite is given."
    )

    def add_arguments(self, parser):
        parser.add_argument("--file", help=f"load this catalog JSON file alone (capgate's own: {DEFAULT_CATALOG_PATH})")
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="replace operator-edited prices and limits with the catalog's too (the edits are lost)",
        )
        parser.add_argument("--dry-run", action="store_true", help="report what would change and save nothing")
        parser.add_argument(
            "--check",
            action="store_true",
            help="print only what loading would change (a diff) and save nothing; exit 1 if it would change anything",
        )

    def handle(self, *args, file, overwrite, dry_run, check, **options):
        skipped: list[Skipped] = []
        try:
            if file:
                data = read_catalog(file)
                label = file
            else:
                data, skipped = genai_catalog(at=timezone.now(), overlay=read_catalog(DEFAULT_CATALOG_PATH))
                label = source()
            result = load_catalog(data=data, overwrite=overwrite, dry_run=dry_run or check)
        except CatalogError as exc:
            raise CommandError(f"{file or label}: {exc}\nNothing was changed.") from exc

        self._report(result, skipped, check=check)
        totals = (
            f"prices as of {result.prices_as_of}: {len(result.created)} created, {len(result.updated)} updated, "
            f"{len(result.unchanged)} unchanged, {len(result.kept)} kept"
        )
        if not file:
            models = len(result.created) + len(result.updated) + len(result.unchanged) + len(result.kept)
            providers = len({c.provider for c in (*result.created, *result.updated, *result.unchanged, *result.kept)})
            totals += f", {len(skipped)} skipped ({label}: {models} models of {providers} providers)"
        if dry_run or check:
            totals += " (dry run: nothing saved)"
        self.stdout.write(self.style.SUCCESS(totals))
        if check and (result.created or result.updated or result.providers_created):
            sys.exit(1)

    def _report(self, result: LoadResult, skipped: list[Skipped], *, check: bool) -> None:
        would = "would be " if result.dry_run else ""
        for slug in result.providers_created:
            self.stdout.write(f"provider {slug} {would}created")
        for change in result.created:
            details = ", ".join(f"{key} {_fmt(change.changes[key][1])}" for key in _SHOWN_ON_CREATE)
            self.stdout.write(f"{would}created {change.label}: {details}")
        for change in result.updated:
            self.stdout.write(f"{would}updated {change.label}: {self._diff(change)}")
        for change in result.kept:
            differences = ", ".join(
                f"{key} {_fmt(old)} (catalog {_fmt(new)})" for key, (old, new) in change.changes.items()
            )
            self.stdout.write(f"kept {change.label} (edited by an operator; --overwrite replaces it): {differences}")
        if not check:
            for skip in skipped:
                self.stdout.write(f"skipped {skip.label}: {skip.reason}")

    @staticmethod
    def _diff(change: ModelChange) -> str:
        return ", ".join(f"{key} {_fmt(old)} -> {_fmt(new)}" for key, (old, new) in change.changes.items())
