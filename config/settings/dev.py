from .base import *  # noqa: F403
from .base import env

DEBUG = True
# Alert emails go to the worker's log unless an SMTP server is configured.
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
