"""What a gateway worker imports at startup, and that the Celery app is still the project's
wherever a task is sent from (docs/decisions.md, "What a gateway worker imports").

Each check runs in a fresh interpreter: this test process has imported everything already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Loaded where they are first needed: a Bedrock connection signs (botocore), a Vertex connection
# asks for a token or a key is checked (google-auth), a task is sent or a worker starts (Celery),
# a routed model names an encoding (tiktoken).
LAZY = ("celery", "kombu", "botocore", "google.auth", "google.oauth2", "tiktoken")


def _fresh(script: str) -> dict:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_gateway_worker_starts_without_the_libraries_only_some_requests_need():
    found = _fresh(
        "import json, sys\n"
        "from config.asgi import application\n"
        f"print(json.dumps({{'loaded': [m for m in {LAZY!r} if m in sys.modules]}}))\n"
    )
    assert found["loaded"] == []


def test_a_task_sent_from_any_process_goes_through_the_projects_app():
    """A gateway process imports a tasks module only to send its task (alerts/alerts.py): the
    task must be bound to the project's app, its broker and queue, never Celery's default app
    (which would send to amqp://localhost). And `celery -A config` finds that same app, with
    the beat schedule."""
    found = _fresh(
        "import json, django\n"
        "django.setup()\n"
        "from django.conf import settings\n"
        "from alerts.tasks import send_alert_email\n"
        # What a send would use, read before this script imports the app itself.
        "sent_by = send_alert_email._get_app()\n"
        "broker, queue = sent_by.conf.broker_url, sent_by.conf.task_default_queue\n"
        "from core.celery import app\n"
        "from celery.app.utils import find_app\n"
        "entry = find_app('config')\n"
        "print(json.dumps({'same': sent_by is app, 'broker': broker, 'want': settings.CELERY_BROKER_URL,\n"
        "  'queue': queue, 'entry': entry is app, 'beat': sorted(entry.conf.beat_schedule)}))\n"
    )
    assert found["same"] is True
    assert found["broker"] == found["want"]
    assert found["queue"] == os.environ.get("CAPGATE_CELERY_QUEUE", "celery")
    assert found["entry"] is True
    assert "renew-and-expire" in found["beat"] and "drain-usage" in found["beat"]
