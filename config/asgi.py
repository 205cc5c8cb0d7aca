import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
django_application = get_asgi_application()

from gateway.app import CapgateASGI  # noqa: E402  (needs Django set up first)

application = CapgateASGI(django_application)
