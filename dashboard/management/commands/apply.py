"""`manage.py apply FILE [--dry-run]`: declare organizations and their configuration as code."""

import json
from pathlib import Path

import yaml
from django.core.management.base import BaseCommand, CommandError

from dashboard.services.apply import ApplyError
from dashboard.services.apply_document import apply_config


class Command(BaseCommand):
    help = "Apply a YAML or JSON configuration file (idempotent). --dry-run prints the diff only."

    def add_arguments(self, parser):
        parser.add_argument("file", help="YAML (.yaml/.yml) or JSON (.json) file; '-' reads YAML from stdin")
        parser.add_argument("--dry-run", action="store_true", help="print what would change; change nothing")

    def handle(self, *args, file: str, dry_run: bool, **options):
        data = self._load(file)
        try:
            result = apply_config(data=data, dry_run=dry_run)
        except ApplyError as exc:
            # Every bad item, one a line, each with its path in the file.
            if len(exc.problems) == 1:
                raise CommandError(f"{exc} (nothing was changed)") from exc
            raise CommandError(
                f"{len(exc.problems)} errors (nothing was changed):\n  " + str(exc).replace("\n", "\n  ")
            ) from exc
        for change in result.changes:
            self.stdout.write(str(change))
        for label, secret in result.secrets:
            # Shown once: only the hash is stored.
            self.stdout.write(f"key {label} secret (shown once): {secret}")
        n = len(result.changes)
        if dry_run:
            self.stdout.write(f"dry run: {n} change(s) would be made; nothing changed")
        else:
            self.stdout.write(f"{n} change(s) applied" if n else "no changes")

    def _load(self, file: str):
        import sys

        try:
            text = sys.stdin.read() if file == "-" else Path(file).read_text()
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror}") from exc
        try:
            if file.endswith(".json"):
                return json.loads(text)
            return yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise CommandError(f"{file} is not valid {'JSON' if file.endswith('.json') else 'YAML'}: {exc}") from exc
