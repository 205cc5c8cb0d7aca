import sys
from datetime import timedelta
from pathlib import Path

from core.env import BASE_DIR, env

from . import pooling

SECRET_KEY = env("DJANGO_SECRET_KEY", default="dev-insecure-change-me")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "axes",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "tenants",
    "catalog",
    "ledger",
    "budgets",
    # The alerts app keeps the label "usage" it was created under: its tables (usage_alertevent,
    # ...) and migration history are named by the label.
    "alerts",
    "ratelimits",
    "django_filters",
    "requestlog",
    "gateway",
    "jobs",
    "echo",
    "capcheck",
    "dashboard",
    "django_htmx",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Before anything that queries: a NUL in the path, query or form fields is a 404/400, not a 500.
    "core.middleware.RefuseNulMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # request.htmx: live panels answer htmx's polls with their fragment only.
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes requires: turns a locked-out login into its lockout response.
    "axes.middleware.AxesMiddleware",
]

# django-axes first: a locked-out username+address is refused before its password is hashed
# (so a guessing run also stops costing CPU), for the dashboard login, the admin and any other
# password login that calls authenticate(request, ...).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Lock out the pair (username, client address) after this many failures in a row, for the
# cool-off time. The pair, not the username alone: a stranger cannot lock an owner out of their
# own account from elsewhere. Attempts are counted in the database (every process agrees).
AXES_FAILURE_LIMIT = env.int("CAPGATE_LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("CAPGATE_LOGIN_LOCKOUT_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# The client address is REMOTE_ADDR (never a header a client could forge). Behind a reverse
# proxy that sets X-Forwarded-For, name its header and hop count (docs/security.md).
AXES_IPWARE_META_PRECEDENCE_ORDER = env.list("CAPGATE_CLIENT_IP_HEADERS", default=["REMOTE_ADDR"])

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

# The project's templates: beside the code in a checkout, under <prefix>/share/capgate in an
# installed wheel (pyproject.toml's data-files; the image).
TEMPLATES_DIR = next(
    (d for d in (BASE_DIR / "templates", Path(sys.prefix) / "share" / "capgate" / "templates") if d.is_dir()),
    BASE_DIR / "templates",
)
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [TEMPLATES_DIR],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Postgres is the source of truth for every cap. psycopg 3's pool (with CONN_MAX_AGE=0, as
# Django requires for the pool) keeps hundreds of concurrent requests from opening hundreds of
# server connections.
DATABASES = {
    "default": {
        **env.db("DATABASE_URL", default="postgres://capgate:capgate@127.0.0.1:15432/capgate"),
        "CONN_MAX_AGE": 0,
        # The pool checks a connection before handing it out (one empty query): after a database
        # restart its idle connections are all dead, and a thread reconnecting must not be given
        # one (gateway/upstream/runtime.py drops a thread's own dead connection before using it).
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {
            "pool": {
                "min_size": env.int("CAPGATE_DB_POOL_MIN", default=2),
                # CAPGATE_DB_POOL_MAX for the gateway's database threads (each holds one for the
                # process's life), plus a slice only the dashboard, the API and commands can use,
                # so gateway load cannot time them out (gateway/upstream/runtime.py sizes its threads).
                "max_size": env.int("CAPGATE_DB_POOL_MAX", default=20)
                + env.int("CAPGATE_DB_WEB_CONNECTIONS", default=6),
                # Short: gateway threads never outnumber the pool, so a wait here means the
                # database is unreachable, and admission should fail closed quickly.
                "timeout": env.float("CAPGATE_DB_POOL_TIMEOUT", default=3.0),
            },
        },
    }
}
# Behind PgBouncer in transaction mode (CAPGATE_DB_POOLER=transaction, DATABASE_URL naming the
# pooler): no server-side cursors and no prepared statements (config/settings/pooling.py).
DB_POOLER = env("CAPGATE_DB_POOLER", default="")
DATABASES["default"] = pooling.database(pooler=DB_POOLER, default=DATABASES["default"])
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The pool connections the gateway's threads leave for Django's own requests (see above).
CAPGATE_DB_WEB_CONNECTIONS = env.int("CAPGATE_DB_WEB_CONNECTIONS", default=6)

# Django's full set, at 12 characters: "93847261" (all digits, short) is refused. They apply where
# a person chooses a password (reset, set-password forms); `manage.py apply` sets the demo's
# declared password directly.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Where `manage.py collectstatic` puts the static files production serves (whitenoise, prod.py).
STATIC_ROOT = env.path("CAPGATE_STATIC_ROOT", default=str(BASE_DIR / "var" / "static"))
# Behind HTTPS in production set DJANGO_SECURE_COOKIES=true: session and CSRF cookies are then
# sent over HTTPS only. Off by default so the local http:// run command can log in.
SESSION_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SESSION_COOKIE_HTTPONLY = True
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:home"
LOGOUT_REDIRECT_URL = "login"

REDIS_URL = env("REDIS_URL", default="redis://127.0.0.1:16379/0")
# Every Redis client of the app (rate limits, the throttle cache, echo's job store): a pooled
# connection idle for longer than this is pinged before reuse, so one a Redis restart killed is
# replaced rather than failing a request; TCP keepalive finds peers that vanished silently.
REDIS_SOCKET_HEALTH = {
    "health_check_interval": env.int("CAPGATE_REDIS_HEALTH_CHECK_SECONDS", default=15),
    "socket_keepalive": True,
}
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"
# A broker outage never ends a worker or beat: they retry the connection for as long as it
# takes (Celery's default gives up after 100 tries), at startup too. The consumer class keeps
# a lost connection with unacknowledged messages from ending the worker (core/celery_consumer.py).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_CONSUMER = "core.celery_consumer:Consumer"

EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env("EMAIL_HOST", default="127.0.0.1")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="capgate <alerts@capgate.localhost>")

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Organization API tokens (Bearer cgt_…) for scripts; the dashboard's session for people
    # (session writes are CSRF-checked by DRF).
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.api.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.api.auth.OrgPermission"],
    "DEFAULT_PAGINATION_CLASS": "core.pagination.Pagination",  # one style everywhere (limit/offset)
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "tenants.api.auth.api_exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON bodies go through config/jsonlimits.py: at most DATA_UPLOAD_MAX_MEMORY_SIZE bytes
    # (Django's 2.5 MB) and CAPGATE["MAX_JSON_DEPTH"] levels, else 413/400 in the API's shape.
    "DEFAULT_PARSER_CLASSES": [
        "core.parsers.LimitedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Per API token, else per signed-in user, else per client address (config/throttles.py);
    # 429 with Retry-After in the API's error shape.
    "DEFAULT_THROTTLE_CLASSES": ["config.throttles.ApiThrottle", "config.throttles.AnonApiThrottle"],
    # Client address = REMOTE_ADDR unless proxies are declared (X-Forwarded-For is forgeable).
    "NUM_PROXIES": env.int("CAPGATE_NUM_PROXIES", default=0),
    "DEFAULT_THROTTLE_RATES": {
        "api": env("CAPGATE_API_THROTTLE_RATE", default="600/minute"),
        "api_anon": env("CAPGATE_API_ANON_THROTTLE_RATE", default="60/minute"),
    },
}
# The API throttles' counters: in Redis, so every process counts against one rate.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "throttle": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": env("CAPGATE_THROTTLE_CACHE_URL", default=env("REDIS_URL", default="redis://127.0.0.1:16379/0")),
        "KEY_PREFIX": "capgate-throttle",
        "TIMEOUT": 3600,
        "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5, **REDIS_SOCKET_HEALTH},
    },
}
SPECTACULAR_SETTINGS = {
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "TITLE": "capgate management API",
    "DESCRIPTION": "Budgets, keys, members, end customers, connections, prices, usage and alerts "
    "of an organization. Authenticate with `Authorization: Bearer cgt_…` (an organization API token).",
    "VERSION": "0.1.0",
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "COMPONENT_SPLIT_REQUEST": True,
    # One tag per resource: the path segment after the organization (/api/orgs/{org_slug}/keys/ -> keys),
    # so the docs group operations by what they act on rather than under one "api" heading.
    "SCHEMA_PATH_PREFIX": r"/api/orgs/\{org_slug\}",
    "ENUM_NAME_OVERRIDES": {
        "BudgetPeriodEnum": "ledger.models.Budget.Period",
        "BudgetModeEnum": "ledger.models.Budget.Mode",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env("CAPGATE_LOG_LEVEL", default="INFO")},
}

# --- capgate ---------------------------------------------------------------------------------
CAPGATE = {
    # Where the spool (usage records written while the database is down) lives.
    "DATA_DIR": env.path("CAPGATE_DATA_DIR", default=str(BASE_DIR / "var")),
    # A reservation's lease: renewed by beat while its gateway process heartbeats.
    "LEASE": timedelta(seconds=env.int("CAPGATE_LEASE_SECONDS", default=120)),
    # A request's hard maximum lifetime; its reservation's deadline.
    "MAX_REQUEST_LIFETIME": timedelta(seconds=env.int("CAPGATE_MAX_REQUEST_SECONDS", default=7200)),
    # Provider jobs (jobs/): a job's hold is renewed by beat for this long each time the provider
    # reports it alive (longer than the slowest poll interval, so a live job never lapses), and
    # never past its hard deadline: a batch's 24 h completion window plus a margin; background
    # responses and videos a configured maximum. Polls back off from the first to the last interval.
    "JOB_LEASE": timedelta(seconds=env.int("CAPGATE_JOB_LEASE_SECONDS", default=900)),
    "JOB_BATCH_DEADLINE": timedelta(hours=env.int("CAPGATE_JOB_BATCH_DEADLINE_HOURS", default=26)),
    "JOB_MAX_SECONDS": timedelta(seconds=env.int("CAPGATE_JOB_MAX_SECONDS", default=6 * 3600)),
    "JOB_POLL_FIRST": timedelta(seconds=env.int("CAPGATE_JOB_POLL_FIRST_SECONDS", default=5)),
    "JOB_POLL_LAST": timedelta(seconds=env.int("CAPGATE_JOB_POLL_LAST_SECONDS", default=300)),
    "JOB_POLL_PER_RUN": env.int("CAPGATE_JOB_POLL_PER_RUN", default=100),
    # A batch input file larger than this is refused with 413 before it is parsed.
    "MAX_FILE_BYTES": env.int("CAPGATE_MAX_FILE_BYTES", default=100 * 1024 * 1024),
    # One tenant cannot starve the others (jobs/uploads.py, docs/operations.md): uploads one
    # organization may run at once in one gateway process (more: 429), the bytes of uploaded files
    # it may keep (more: 413), and how many uploads one process sizes at once (the rest wait).
    "ORG_CONCURRENT_UPLOADS": env.int("CAPGATE_ORG_CONCURRENT_UPLOADS", default=2),
    "ORG_STORED_FILE_BYTES": env.int("CAPGATE_ORG_STORED_FILE_BYTES", default=10 * 1024 * 1024 * 1024),
    "SIZING_CONCURRENCY": env.int("CAPGATE_SIZING_CONCURRENCY", default=2),
    # Provider jobs one organization may have capgate tracking at once (live or cancelling: each a
    # row beat polls, a hold it renews, an output its provider keeps); one more submission is
    # refused with 429 before admission (jobs/service.py). Beat polls JOB_POLL_PER_RUN (100) jobs
    # every 5 s, 6,000 per slowest poll interval: a few organizations at the bound fit in it.
    "ORG_LIVE_JOBS": env.int("CAPGATE_ORG_LIVE_JOBS", default=1000),
    # How long echo's job store in Redis keeps an object (echo/jobs.py): a demo's files (bounded in
    # bytes per organization by ORG_STORED_FILE_BYTES) and batch outputs (each bounded by
    # ECHO_MAX_OUTPUT_BYTES) do not sit in Redis for a week.
    "ECHO_STORE_SECONDS": env.int("CAPGATE_ECHO_STORE_SECONDS", default=86400),
    # The most one echo batch may write to Redis as its output (OpenAI: output and error files
    # together; Anthropic: the results): past it an OpenAI batch ends `failed` with the error
    # `output_too_large` and a message batch is refused with 413, nothing stored (echo/batches.py).
    # Redis's memory bound is 512 MB (operations.md, "Redis"): one batch takes at most an eighth.
    "ECHO_MAX_OUTPUT_BYTES": env.int("CAPGATE_ECHO_MAX_OUTPUT_BYTES", default=64 * 1024 * 1024),
    # A lifetime window (a finished run's) with no holds and no charge for this long leaves the
    # live audit set; it stays in history and rejoins it when charged again.
    "AUDIT_IDLE_LIFETIME": timedelta(hours=env.int("CAPGATE_AUDIT_IDLE_LIFETIME_HOURS", default=72)),
    # The scheduled audit is incremental: the windows changed since its previous run (touched up
    # to AUDIT_OVERLAP before it began: a drain that committed late) plus the next AUDIT_SAMPLE
    # live windows in id order, so every window is checked every (live windows / sample) runs.
    "AUDIT_SAMPLE": env.int("CAPGATE_AUDIT_SAMPLE", default=2000),
    "AUDIT_OVERLAP": timedelta(seconds=env.int("CAPGATE_AUDIT_OVERLAP_SECONDS", default=300)),
    # Windows read per transaction (one consistent snapshot each), and the statement timeout of
    # each: an audit never holds a snapshot or a core for long while the gateway admits.
    "AUDIT_BATCH": env.int("CAPGATE_AUDIT_BATCH", default=500),
    "AUDIT_STATEMENT_TIMEOUT_MS": env.int("CAPGATE_AUDIT_STATEMENT_TIMEOUT_MS", default=60_000),
    # A scheduled audit's lease older than this belonged to a worker that died mid-run.
    "AUDIT_LEASE": timedelta(seconds=env.int("CAPGATE_AUDIT_LEASE_SECONDS", default=3600)),
    # Output ceiling used when neither the request nor the catalog gives one.
    "DEFAULT_MAX_OUTPUT_TOKENS": 32_768,
    # Per-message framing tokens added to the byte bound of the input.
    "PER_MESSAGE_OVERHEAD_TOKENS": 8,
    "PER_REQUEST_OVERHEAD_TOKENS": 16,
    # Tokens a provider adds that the body does not show (docs/billing.md): its tool-use system
    # prompt when tools are present (Anthropic documents 313-346), and each client-side built-in
    # tool's hidden definition (bash, text editor, computer: up to 735).
    "TOOL_USE_OVERHEAD_TOKENS": env.int("CAPGATE_TOOL_USE_OVERHEAD_TOKENS", default=1024),
    "BUILTIN_TOOL_OVERHEAD_TOKENS": env.int("CAPGATE_BUILTIN_TOOL_OVERHEAD_TOKENS", default=1024),
    # Server-side tools without max_uses get this one, sent upstream, so their count is bounded;
    # web_fetch without max_content_tokens gets this one.
    "DEFAULT_SERVER_TOOL_MAX_USES": env.int("CAPGATE_DEFAULT_SERVER_TOOL_MAX_USES", default=5),
    "DEFAULT_WEB_FETCH_MAX_CONTENT_TOKENS": env.int("CAPGATE_DEFAULT_WEB_FETCH_MAX_CONTENT_TOKENS", default=20_000),
    # Under a blocking budget with no max_tokens, refuse rather than send an output ceiling
    # below this many tokens (a response that short is rarely what the caller wanted).
    "MIN_OUTPUT_TOKENS": env.int("CAPGATE_MIN_OUTPUT_TOKENS", default=256),
    # Exact prompt counts (gateway/admission/tokens.py): the encodings scripts/bootstrap.sh builds, and for
    # prompts above EXACT_COUNT_MAX_BYTES the share of the tightest ceiling's room above which
    # their byte bound is replaced by an exact count (0: always count).
    # <prefix>/share/tiktoken: .venv's in a checkout, the image's environment in Docker (the
    # wheel carries the files there when they were built before it, Dockerfile).
    "TOKENIZER_DIR": env.path("CAPGATE_TOKENIZER_DIR", default=str(Path(sys.prefix) / "share" / "tiktoken")),
    "EXACT_COUNT_SHARE": env.float("CAPGATE_EXACT_COUNT_SHARE", default=0.05),
    # The token counter's Unix socket (gateway/admission/token_counter.py): set, a worker loads no
    # encoding and asks the one counter process on its host; empty, each worker loads its own.
    "TOKEN_COUNTER": env("CAPGATE_TOKEN_COUNTER", default=""),
    # Prompts up to this many bytes are counted exactly under a blocking cap whenever the model's
    # tokenizer is known (~15 ms for the slowest text on a 2-core host: bench/prompt_counts.py);
    # larger ones only past EXACT_COUNT_SHARE of the tightest room (gateway/admission/sizing.py).
    "EXACT_COUNT_MAX_BYTES": env.int("CAPGATE_EXACT_COUNT_MAX_BYTES", default=131_072),
    # Headroom slices (ledger/slices.py, docs/operations.md "Hot ceilings"): a gateway process
    # reserves a slice of its subjects' ceilings in one admission and admits requests from it in
    # memory. A slice is at most SHARE of the tightest ceiling's room divided among the live
    # gateway processes, and at most MAX_REQUESTS of the request's worst case; one that would be
    # smaller than MIN_REQUESTS worst cases is not taken (one admission per request, near the
    # cap). A slice admits for SECONDS at most, then gives back what it did not use.
    "SLICES": env.bool("CAPGATE_SLICES", default=True),
    # The group commit's statement sent from the event loop on its own connection, and written on
    # a database thread only when that fails (gateway/upstream/loopdb.py). Off: always a thread.
    "LOOP_RECORDS": env.bool("CAPGATE_LOOP_RECORDS", default=True),
    "SLICE_SHARE": env.float("CAPGATE_SLICE_SHARE", default=0.5),
    "SLICE_MIN_REQUESTS": env.int("CAPGATE_SLICE_MIN_REQUESTS", default=4),
    "SLICE_MAX_REQUESTS": env.int("CAPGATE_SLICE_MAX_REQUESTS", default=256),
    "SLICE_SECONDS": env.float("CAPGATE_SLICE_SECONDS", default=2.0),
    # Each gateway process heartbeats this often; beat renews the leases of live processes.
    "HEARTBEAT_INTERVAL": timedelta(seconds=env.int("CAPGATE_HEARTBEAT_SECONDS", default=10)),
    # Each gateway process drains its own records this long after a response (one batch per
    # interval, so a hot ceiling takes one lock per batch rather than one per request).
    "DRAIN_INTERVAL": env.float("CAPGATE_DRAIN_INTERVAL", default=0.05),
    # How long to wait for upstream bytes (a stream may pause this long between chunks).
    "UPSTREAM_READ_TIMEOUT": env.float("CAPGATE_UPSTREAM_READ_TIMEOUT", default=600.0),
    # Upstream reach and capacity (docs/security.md). Networks a connection may reach besides
    # public addresses: comma-separated CIDRs, environment only (never tenant-editable).
    "UPSTREAM_ALLOWED_NETWORKS": env.list("CAPGATE_UPSTREAM_ALLOWED_NETWORKS", default=[]),
    # A Bedrock connection without keys signs with the gateway's own AWS credential chain
    # (environment, profile, instance role): the operator's account. Off by default, so no tenant
    # can spend it; a single-tenant deployment turns it on.
    "BEDROCK_AMBIENT_CREDENTIALS": env.bool("CAPGATE_BEDROCK_AMBIENT_CREDENTIALS", default=False),
    # Per gateway process: upstream sockets in all, and in-flight upstream calls one connection
    # and one organization may hold (over it: 429 at once, instead of queueing for everyone).
    "UPSTREAM_MAX_CONNECTIONS": env.int("CAPGATE_UPSTREAM_MAX_CONNECTIONS", default=2000),
    "UPSTREAM_MAX_PER_CONNECTION": env.int("CAPGATE_UPSTREAM_MAX_PER_CONNECTION", default=500),
    "UPSTREAM_MAX_PER_ORGANIZATION": env.int("CAPGATE_UPSTREAM_MAX_PER_ORGANIZATION", default=500),
    "UPSTREAM_CONNECT_TIMEOUT": env.float("CAPGATE_UPSTREAM_CONNECT_TIMEOUT", default=5.0),
    # Until the response's headers: for a non-stream call that is the whole generation.
    "UPSTREAM_FIRST_BYTE_TIMEOUT": env.float("CAPGATE_UPSTREAM_FIRST_BYTE_TIMEOUT", default=300.0),
    "UPSTREAM_POOL_TIMEOUT": env.float("CAPGATE_UPSTREAM_POOL_TIMEOUT", default=10.0),
    # Rate limits' counters (requests and tokens per minute) live here; if it is unreachable,
    # each process falls back to counting in its own memory (docs/security.md, "Rate limits").
    "RATE_LIMIT_STORAGE_URL": env("CAPGATE_RATE_LIMIT_STORAGE_URL", default=REDIS_URL),
    # Per API key, the new runs (a run budget to create: X-Capgate-Run) and new end customers
    # (X-Capgate-Customer) its first calls may name a minute; over it, 429 before any row is
    # written (ratelimits/services.py enforce_new_subjects). Each is a budget, a window and an
    # audit row; 0: no limit.
    "NEW_RUNS_PER_KEY_PER_MINUTE": env.int("CAPGATE_NEW_RUNS_PER_KEY_PER_MINUTE", default=300),
    "NEW_CUSTOMERS_PER_KEY_PER_MINUTE": env.int("CAPGATE_NEW_CUSTOMERS_PER_KEY_PER_MINUTE", default=300),
    # Idle pooled Redis connections of a gateway process are closed this often (gateway/upstream/runtime.py).
    "REDIS_IDLE_DROP_SECONDS": env.float("CAPGATE_REDIS_IDLE_DROP_SECONDS", default=60.0),
    # A body larger than this is refused with 413 before it is parsed.
    "MAX_BODY_BYTES": env.int("CAPGATE_MAX_BODY_BYTES", default=20 * 1024 * 1024),
    # A request body (up to MAX_BODY_BYTES, or a job's file) must arrive within this; 408 after.
    "BODY_READ_TIMEOUT_SECONDS": env.float("CAPGATE_BODY_READ_TIMEOUT_SECONDS", default=60.0),
    # JSON nested deeper than this is refused with 400 (gateway and API): Python's parser would
    # otherwise recurse into a RecursionError. Real requests nest about 20 levels.
    "MAX_JSON_DEPTH": env.int("CAPGATE_MAX_JSON_DEPTH", default=64),
    # Gateway processes cache keys, routes, prices, rate limits, classifications and budget
    # definitions, emptied by the notice each write sends from its transaction (core/invalidation.py).
    # CACHE_NOTIFY off: no listener, budgets are read on every request, and lookups live
    # LOOKUP_CACHE_SECONDS (0: not cached). With it on, LOOKUP_CACHE_SECONDS is how long lookups
    # live while the listener is behind or reconnecting. The budget cache's rule
    # (ledger/budget_cache.py): an entry is used only while a fence came back within
    # CACHE_LEASE_SECONDS, and a budget edit returns only once that long has passed since its commit.
    "CACHE_NOTIFY": env.bool("CAPGATE_CACHE_NOTIFY", default=True),
    "CACHE_LEASE_SECONDS": env.float("CAPGATE_CACHE_LEASE_SECONDS", default=1.0),
    "LOOKUP_CACHE_SECONDS": env.float("CAPGATE_LOOKUP_CACHE_SECONDS", default=2.0),
    # The request log (requestlog/): refusals wait in each gateway process's memory at most this
    # long before one batched insert, and at most this many (more are dropped and counted: a
    # refusal flood while the database is down must not grow the process without bound).
    "REQUEST_LOG_FLUSH_SECONDS": env.float("CAPGATE_REQUEST_LOG_FLUSH_SECONDS", default=1.0),
    "REQUEST_LOG_BUFFER": env.int("CAPGATE_REQUEST_LOG_BUFFER", default=10_000),
    # Refusal rows older than this are deleted by beat (usage records, the book of record, are not).
    "REQUEST_LOG_RETENTION_DAYS": env.int("CAPGATE_REQUEST_LOG_RETENTION_DAYS", default=90),
    # History past its days is deleted by beat, hourly, in short batches (core/retention.py;
    # docs/operations.md, "Retention"); 0 keeps it for good. Stored responses bound a later
    # continuation (each conversation's latest is kept); audit runs and alert events (those of a
    # current window or still being delivered are kept); gateway-process rows (those owning a
    # reservation are kept); the audit log, kept for good unless an organization's policy says not.
    "STORED_RESPONSE_RETENTION_DAYS": env.int("CAPGATE_STORED_RESPONSE_RETENTION_DAYS", default=30),
    "AUDIT_RUN_RETENTION_DAYS": env.int("CAPGATE_AUDIT_RUN_RETENTION_DAYS", default=30),
    "ALERT_EVENT_RETENTION_DAYS": env.int("CAPGATE_ALERT_EVENT_RETENTION_DAYS", default=400),
    "INSTANCE_RETENTION_DAYS": env.int("CAPGATE_INSTANCE_RETENTION_DAYS", default=7),
    "AUDIT_LOG_RETENTION_DAYS": env.int("CAPGATE_AUDIT_LOG_RETENTION_DAYS", default=0),
    # A gateway process that has not heartbeated for this long is presumed dead.
    "HEARTBEAT_GRACE": timedelta(seconds=env.int("CAPGATE_HEARTBEAT_GRACE_SECONDS", default=30)),
    # /readyz answers within this: a 503 naming the database when it has not answered by then.
    "READYZ_TIMEOUT_SECONDS": env.float("CAPGATE_READYZ_TIMEOUT_SECONDS", default=1.0),
    # Alert emails link here (the dashboard's public base URL).
    "DASHBOARD_URL": env("CAPGATE_DASHBOARD_URL", default="http://127.0.0.1:8000"),
    # GET /metrics requires `Authorization: Bearer <this>` when set (empty: open, for a scraper
    # on a private network).
    "METRICS_TOKEN": env("CAPGATE_METRICS_TOKEN", default=""),
    # Alert webhooks: how long to wait for the receiver, and attempts before a delivery fails.
    "WEBHOOK_TIMEOUT": env.float("CAPGATE_WEBHOOK_TIMEOUT", default=10.0),
    # OpenTelemetry traces of every HTTP request (config/tracing.py), exported over OTLP to the
    # standard OTEL_EXPORTER_OTLP_* endpoint. Off: nothing of OpenTelemetry is even imported.
    "OTEL_ENABLED": env.bool("CAPGATE_OTEL_ENABLED", default=False),
}
# The slices' LISTEN connection (gateway/upstream/runtime.py): direct to Postgres, never through a
# transaction pooler, which carries no session to LISTEN in (config/settings/pooling.py).
CAPGATE["LISTEN_DATABASE"] = pooling.listen_database(
    pooler=DB_POOLER,
    direct=env.db("CAPGATE_LISTEN_DATABASE_URL") if env("CAPGATE_LISTEN_DATABASE_URL", default="") else None,
    slices=CAPGATE["SLICES"],
)
