from __future__ import annotations

from django.apps import AppConfig


class LedgerConfig(AppConfig):
    """The only writer of money rows. Its models (ledger/models.py) keep the tables the budgets
    and usage apps first created; ready() connects the subject-deletion hook."""

    name = "ledger"

    def ready(self) -> None:
        # Imported here, not at the top: an AppConfig module is imported before the app
        # registry is ready, and these import models.
        from ledger.recording import freeze_subject_name
        from tenants.signals import subject_deleting

        subject_deleting.connect(freeze_subject_name, dispatch_uid="ledger.recording.freeze_subject_name")
