"""The project's settings, URLs and entry points.

Unlike Celery's Django guide, this package does not import the Celery app: each tasks module
declares its tasks on core/celery.py's app, so a process has the app once it has a task to send,
and a gateway worker does not carry Celery from startup (docs/decisions.md, "What a gateway
worker imports"). `celery -A config` finds config/celery.py itself.
"""
