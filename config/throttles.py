"""Management API throttles: one rate per API token, else per signed-in user,
else per client address. DRF's sliding-window algorithm, counted in the "throttle" cache (Redis,
so every process shares one count).

The count is read-then-written, so concurrent requests can overshoot by a few: fine for abuse
protection (STYLE.md keeps that pattern away from money only). If Redis is unreachable the
throttle lets requests through and logs: the API must keep working without it, and no money
depends on it.
"""

from __future__ import annotations

import logging

from django.core.cache import caches
from redis.exceptions import RedisError
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from tenants.models import ApiToken

log = logging.getLogger("capgate.api")


class ApiThrottle(SimpleRateThrottle):
    """Authenticated callers: by token, else by user."""

    scope = "api"

    @property
    def cache(self):  # type: ignore[override]
        return caches["throttle"]

    def get_rate(self) -> str | None:
        # Read at each request, not at import, so a settings change applies.
        rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)
        return None if rate is None else str(rate)

    def get_cache_key(self, request, view) -> str | None:
        if isinstance(request.auth, ApiToken):
            ident = f"token:{request.auth.pk}"
        elif getattr(request.user, "is_authenticated", False):
            ident = f"user:{request.user.pk}"
        else:
            return None
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def allow_request(self, request, view) -> bool:
        try:
            return super().allow_request(request, view)
        except (RedisError, OSError):
            log.warning("API throttle store unreachable: request let through unthrottled")
            return True


class AnonApiThrottle(ApiThrottle):
    """Callers with no credentials (the schema and docs pages), by client address."""

    scope = "api_anon"

    def get_cache_key(self, request, view) -> str | None:
        if isinstance(request.auth, ApiToken) or getattr(request.user, "is_authenticated", False):
            return None
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
