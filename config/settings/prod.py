import os

from config import deploychecks

from .base import *  # noqa: F403
from .base import ALLOWED_HOSTS, MIDDLEWARE, env

# Refuse to start with a missing or published secret (config/deploychecks.py): Django's signs
# sessions and password-reset links, CAPGATE_SECRET_KEY encrypts connection secrets (without it
# they would be encrypted with a key derived from the Django one). 50 characters is Django's own
# deploy check; a Fernet key is 44.
SECRET_KEY = deploychecks.require_secret(os.environ, "DJANGO_SECRET_KEY", min_length=50)
deploychecks.require_secret(os.environ, "CAPGATE_SECRET_KEY", min_length=32)
deploychecks.refuse_wildcard_hosts(ALLOWED_HOSTS)

SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# HSTS: browsers keep to HTTPS for a year once they have seen it. Subdomains and preload are
# opt-in: they bind every subdomain of the host, which only its owner can decide.
SECURE_HSTS_SECONDS = env.int("DJANGO_HSTS_SECONDS", default=365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_HSTS_PRELOAD", default=False)
# Plain http to the dashboard is redirected to https (the /v1 gateway is not Django's and is
# not redirected). Off only behind a proxy that already redirects.
SECURE_SSL_REDIRECT = env.bool("DJANGO_SSL_REDIRECT", default=True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SESSION_COOKIE_HTTPONLY = True

# Static files (the admin's, Swagger UI's on /api/docs/, the dashboard's) are served by the app
# itself: whitenoise answers /static/ from STATIC_ROOT, which `manage.py collectstatic` fills
# (the image does it at build time, docs/operations.md "Static files"). Names carry a hash of the
# content, so they are cached for a year; gzip copies are made at collect time. Right after
# SecurityMiddleware, so HTTPS redirects and HSTS apply to static files too, and before sessions.
assert MIDDLEWARE[0] == "django.middleware.security.SecurityMiddleware"
MIDDLEWARE = [MIDDLEWARE[0], "whitenoise.middleware.WhiteNoiseMiddleware", *MIDDLEWARE[1:]]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
