from .base import *  # noqa: F403
from .base import DATABASES, env

# Tests open one connection per racing thread (up to a few hundred). Django's pool is per
# thread-alias anyway; without a pool each thread owns exactly one server connection, which is
# what the concurrency tests want: every racer has its own connection. The rest of OPTIONS
# (prepared statements on a direct connection, none behind a pooler) stays as deployed.
DATABASES["default"]["OPTIONS"] = {k: v for k, v in DATABASES["default"]["OPTIONS"].items() if k != "pool"}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
CELERY_TASK_ALWAYS_EAGER = False

# Several suites may share one Postgres cluster (parallel checkouts): each names its own DB.
DATABASES["default"]["TEST"] = {"NAME": env("CAPGATE_TEST_DB", default="test_capgate")}  # noqa: F405

# Tests never publish to the shared Redis by accident (alert emails queued after a drain);
# tests that need the real broker set their own.
CELERY_BROKER_URL = "memory://"

# API throttle counters stay in this process (tests of the throttle lower the rates again);
# the suite's own API traffic must not be throttled.
CACHES = {
    **CACHES,  # noqa: F405
    "throttle": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "throttle",
    },
}
REST_FRAMEWORK = {
    **REST_FRAMEWORK,  # noqa: F405
    "DEFAULT_THROTTLE_RATES": {
        "api": "100000/minute",
        "api_anon": "100000/minute",
    },
}

# Tests change keys, routes and budgets (through the ORM) and expect the next request to see it;
# the caches' own tests (tests/gateway/test_cache_notices.py, tests/gateway/test_lookup_notices.py)
# turn them on. A short lease keeps the budget edits of tests with a live gateway quick.
CAPGATE = {**CAPGATE, "LOOKUP_CACHE_SECONDS": 0.0, "CACHE_LEASE_SECONDS": 0.3}  # noqa: F405
CAPGATE["CACHE_NOTIFY"] = env.bool("CAPGATE_CACHE_NOTIFY", default=False)  # noqa: F405

# Most tests assert one admission per request (exact window counters after each step); the
# headroom slices' own tests (tests/ledger/test_slices.py, tests/gateway/test_slices_http.py)
# turn them on, as production has them.
CAPGATE["SLICES"] = env.bool("CAPGATE_SLICES", default=False)  # noqa: F405

# The fake upstreams listen on loopback; tests of the destination guard take this away again.
CAPGATE["UPSTREAM_ALLOWED_NETWORKS"] = ["127.0.0.0/8", "::1/128"]
