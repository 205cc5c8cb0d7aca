"""The Celery app every tasks module declares its tasks on (`@app.task`).

It lives here, below every app, so that a task's module imports the app it is sent through: a
process that sends a task (a gateway's drain queues alert emails and webhooks) has the
project's app, its Redis broker and queue, whatever else it imported. Nothing imports it at
startup, so a gateway worker carries Celery only once it first sends a task (docs/decisions.md,
"What a gateway worker imports"). The worker and beat entry point, with the task discovery and
the beat schedule, is config/celery.py (`celery -A config`).
"""

import os

from celery import Celery

app = Celery("capgate")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Deployments (or test runs) sharing one Redis keep their tasks apart by queue name;
# beat and the alert emails go to this queue, and workers consume it with `-Q`.
app.conf.task_default_queue = os.environ.get("CAPGATE_CELERY_QUEUE", "celery")
