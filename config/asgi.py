import os
from typing import Any

from django.conf import settings
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
django_application = get_asgi_application()

if settings.DEBUG:  # development: serve the dashboard's static files without a web server
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    django_application = ASGIStaticFilesHandler(django_application)

from gateway.http.app import CapgateASGI  # noqa: E402  (needs Django set up first)

application: Any = CapgateASGI(django_application)  # or wrapped for traces, below

if settings.CAPGATE["OTEL_ENABLED"]:  # off by default: OpenTelemetry is then never imported
    from config.tracing import traced

    application = traced(application)
