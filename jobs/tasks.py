"""Beat's job poll (config/celery.py): safe to run twice at once (jobs/poll.py claims with
SKIP LOCKED and moves each job's next poll forward)."""

from __future__ import annotations

from core.celery import app
from jobs.poll import poll_jobs as run_poll


@app.task
def poll_jobs() -> dict[str, int]:
    return run_poll()
