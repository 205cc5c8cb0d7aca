"""capgate's Celery app with every beat entry every second, for the Redis outage test: the
real schedule's minute-long catch-up would make the test wait a minute for nothing.

Run as `celery -A tests.faults.fast_celery worker -B ...`.
"""

from config.celery import app

app.conf.beat_schedule = {
    name: {**entry, "schedule": 1.0, "options": {**entry.get("options", {}), "expires": 1.0}}
    for name, entry in app.conf.beat_schedule.items()
}

__all__ = ["app"]
