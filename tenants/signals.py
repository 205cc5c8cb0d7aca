"""What tenants tells the layers above it, without importing them."""

from __future__ import annotations

from django.dispatch import Signal

# Sent inside a subject's deletion transaction, before the row goes, with organization_id,
# name ("project", "member", "api_key", "end_customer"), pk and label (its name). The ledger
# connects to it (ledger/apps.py) to freeze the name on the subject's usage records.
subject_deleting = Signal()
