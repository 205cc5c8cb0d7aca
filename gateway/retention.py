"""How long the Responses API's stored state is kept (core/retention.py does the deleting).

A stored response is kept STORED_RESPONSE_RETENTION_DAYS (default 30: the providers keep a
stored response about that long, so a continuation from an older one would fail upstream
anyway), except each conversation's latest, from which the conversation's next turn is bounded
(gateway/upstream/continuations.py). A continuation from a response deleted here is treated as
one capgate never relayed: refused under a blocking cap."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from core.retention import delete_expired

_CONVERSATION_LATEST = """
    t.conversation_id IS NOT NULL AND t.id = (
        SELECT max(s.id) FROM gateway_storedresponse s
        WHERE s.organization_id = t.organization_id AND s.conversation_id = t.conversation_id)
"""


def prune_stored_responses() -> int:
    days = settings.CAPGATE["STORED_RESPONSE_RETENTION_DAYS"]
    if not days:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    return delete_expired(
        table="gateway_storedresponse", age_column="created_at", cutoff=cutoff, keep=_CONVERSATION_LATEST
    )
