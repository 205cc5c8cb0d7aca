from django.apps import AppConfig


class BudgetsConfig(AppConfig):
    """Budgets' validated, audited edits, reads and API. The Budget model is the ledger's
    (ledger/models.py): this app has no models, and its migrations hold the history of the
    tables it created before they moved (state only)."""

    name = "budgets"
