"""manage.py load_prices [--file PATH] [--overwrite] [--dry-run]: load the model price catalog."""

from decimal import Decimal

from django.core.management.base import BaseCommand, CommandError

from catalog.prices import (
    DEFAULT_CATALOG_PATH,
    CatalogError,
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
    return str(value)


class Command(BaseCommand):
    help = (
        "Load model prices and limits from a catalog file (default: the shipped catalog/data/prices.json). "
        "New models are created; existing models are left as they are unless --overwrite is given."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--file", default=str(DEFAULT_CATALOG_PATH), help="catalog JSON file (default: %(default)s)"
        )
        parser.add_argument(
            "--overwrite",
            action="store_true",
            help="replace the prices and limits of existing models with the catalog's (operator edits are lost)",
        )
        parser.add_argument("--dry-run", action="store_true", help="report what would change and save nothing")

    def handle(self, *args, file, overwrite, dry_run, **options):
        try:
            result = load_catalog(data=read_catalog(file), overwrite=overwrite, dry_run=dry_run)
        except CatalogError as exc:
            raise CommandError(f"{file}: {exc}\nNothing was changed.") from exc

        would = "would be " if dry_run else ""
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
            self.stdout.write(f"kept {change.label} (differs from the catalog; --overwrite replaces it): {differences}")
        totals = (
            f"prices as of {result.prices_as_of}: {len(result.created)} created, {len(result.updated)} updated, "
            f"{len(result.unchanged)} unchanged, {len(result.kept)} kept"
        )
        if dry_run:
            totals += " (dry run: nothing saved)"
        self.stdout.write(self.style.SUCCESS(totals))

    @staticmethod
    def _diff(change: ModelChange) -> str:
        return ", ".join(f"{key} {_fmt(old)} -> {_fmt(new)}" for key, (old, new) in change.changes.items())
