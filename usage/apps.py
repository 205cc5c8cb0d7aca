from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class UsageConfig(AppConfig):
    name = "usage"

    def ready(self) -> None:
        # Imported here, not at the top: an AppConfig module is imported before the app
        # registry is ready, and these import models.
        from ledger.signals import windows_changed

        windows_changed.connect(_check_thresholds, dispatch_uid="usage.alerts.on_windows_changed")


def _check_thresholds(sender: Any, *, window_ids: list[int], **kwargs: Any) -> None:
    """The ledger added spend to these windows and committed: raise any crossed threshold."""
    from usage.alerts import on_windows_changed  # models: see ready()

    on_windows_changed(window_ids=window_ids)
