from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    """What follows from recorded spend: alerts, webhooks, the counter audit, the usage API.

    The label stays "usage", the app's name before it was renamed: table names
    (`usage_alertevent`, ...), migration history and `apps.get_model("usage", ...)` go by it."""

    name = "alerts"
    label = "usage"

    def ready(self) -> None:
        # Imported here, not at the top: an AppConfig module is imported before the app
        # registry is ready, and these import models.
        from ledger.signals import windows_changed

        windows_changed.connect(_check_thresholds, dispatch_uid="alerts.alerts.on_windows_changed")


def _check_thresholds(sender: Any, *, window_ids: list[int], windows: dict | None = None, **kwargs: Any) -> None:
    """The ledger added spend to these windows and committed: raise any crossed threshold.

    When the drain says where each window's spend stands (`windows`), the windows below every
    threshold are skipped without reading them: on_windows_changed could raise nothing there,
    and its read was most of a drain's CPU (docs/performance.md)."""
    from alerts.alerts import crossed_thresholds, on_windows_changed  # models: see ready()

    if windows is not None:
        window_ids = [w for w in window_ids if crossed_thresholds(**windows[w])]
        if not window_ids:
            return
    on_windows_changed(window_ids=window_ids)
