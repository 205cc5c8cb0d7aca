"""The jobs app's part of capcheck's jobs scenario (capcheck/jobs.py): settle an
organization's jobs now instead of at beat's next due poll."""

from __future__ import annotations

import time

from django.utils import timezone

from jobs.models import Job
from jobs.poll import poll_jobs
from jobs.selectors import LIVE_STATES


def settle_organization(organization_id: int, timeout: float) -> bool:
    """Poll the organization's live jobs until none is left (True) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    live = Job.objects.filter(organization_id=organization_id, state__in=LIVE_STATES)
    while live.exists():
        if time.monotonic() > deadline:
            return False
        live.update(next_poll_at=timezone.now())
        poll_jobs()
        time.sleep(0.1)
    return True
