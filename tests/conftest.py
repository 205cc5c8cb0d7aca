"""The cast: an organization with a project and keys, and an outsider organization."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connections, transaction
from django.db.backends.postgresql.creation import DatabaseCreation
from django.test import TransactionTestCase
from django.utils import timezone

from ledger.admission import AdmissionRequest, Subject, admit
from ledger.models import Budget, Window
from ledger.windows import ensure_windows
from tenants.models import ApiKey, ApiToken, Member, Organization, Project

_ids = itertools.count()


def usd(amount: str | float) -> int:
    from decimal import Decimal

    return int(Decimal(str(amount)) * 1_000_000_000)


@dataclass
class Tenant:
    org: Organization
    project: Project
    key: ApiKey
    keys: list[ApiKey] = field(default_factory=list)

    def subject(self, key: ApiKey | None = None, **extra) -> Subject:
        key = key or self.key
        return Subject(organization_id=self.org.id, project_id=key.project_id, api_key_id=key.id, **extra)

    def request(
        self, request_id: str | None = None, *, worst_nano: int, key: ApiKey | None = None, **kw
    ) -> AdmissionRequest:
        return AdmissionRequest(
            subject=kw.pop("subject", None) or self.subject(key),
            request_id=request_id or f"req-{next(_ids)}",
            worst_nano=worst_nano,
            **kw,
        )

    def admit(self, **kw):
        return admit(request=self.request(**kw))

    def budget(
        self, *, amount: str, scope: str = "organization", mode: str = "block", period: str = "month", **kw
    ) -> Budget:
        return Budget.objects.create(
            organization=self.org, scope=scope, mode=mode, period=period, amount_nano=usd(amount), **kw
        )

    def add_key(self, name: str, project: Project | None = None) -> ApiKey:
        raw, prefix, digest = ApiKey.generate()
        key = ApiKey.objects.create(
            organization=self.org, project=project or self.project, name=name, prefix=prefix, key_hash=digest
        )
        self.keys.append(key)
        return key


def make_tenant(slug: str) -> Tenant:
    with transaction.atomic():  # one commit, not one per row
        org = Organization.objects.create(name=slug.title(), slug=slug)
        project = Project.objects.create(organization=org, name="Main", slug="main")
        raw, prefix, digest = ApiKey.generate()
        key = ApiKey.objects.create(organization=org, project=project, name="default", prefix=prefix, key_hash=digest)
    return Tenant(org=org, project=project, key=key, keys=[key])


def make_api_token(*, organization: Organization, scope: str, member: Member | None = None, name: str = "") -> str:
    """A management API token (raw) of `member`, else of a new admin of the organization: every
    token acts for a member."""
    if member is None:
        email = f"token-admin-{next(_ids)}@{organization.slug}.test"
        admin = get_user_model().objects.create_user(email, email, "password")
        member = Member.objects.create(organization=organization, user=admin, role=Member.Role.ADMIN)
    raw, prefix, digest = ApiToken.generate()
    ApiToken.objects.create(
        organization=organization,
        member=member,
        created_by_id=member.user_id,
        name=name or f"{scope}-token",
        scope=scope,
        prefix=prefix,
        token_hash=digest,
    )
    return raw


@pytest.fixture
def acme(db) -> Tenant:
    return make_tenant("acme")


@pytest.fixture
def slices_on(settings):
    """Headroom slices on, small and long-lived: 20 worst cases at most, none under 4, 60 s each
    (the slices' own tests, tests/ledger, and the caches', tests/gateway/test_cache_notices.py)."""
    settings.CAPGATE = {
        **settings.CAPGATE,
        "SLICES": True,
        "SLICE_SHARE": 0.5,
        "SLICE_MIN_REQUESTS": 4,
        "SLICE_MAX_REQUESTS": 20,
        "SLICE_SECONDS": 60.0,
    }


@pytest.fixture
def outsider(db) -> Tenant:
    return make_tenant("globex")


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", "alice@example.com", "password")


@pytest.fixture(scope="session")
def db_threads(django_db_setup):
    """The gateway's database threads (gateway/upstream/dbthreads.py, one set per process) keep
    their connections from one test's server to the next (tests/gateway/conftest.py `gateway`);
    closed at the session's end, before the test database is dropped."""
    yield
    from gateway.upstream import runtime

    runtime.close_thread_connections()


def window_of(budget: Budget) -> Window:
    return Window.objects.get(budget=budget)


def open_window(budget: Budget) -> Window:
    """Create the budget's current window before a race. A budget created mid-period makes its
    window's creation lock the reservations table until every admission in flight commits
    (ledger/windows.py, create_windows): racers that find no window queue on it in turn, so a
    race meant to be about one guard would be serialized by that lock instead."""
    ensure_windows(budgets=[budget], now=timezone.now())
    return window_of(budget)


# Markers (registered in pyproject.toml), given by where a test lives and what it starts, so a new
# test is marked without anyone remembering to: `-m "not slow"` is the fast tier for editing.
TESTS = Path(__file__).resolve().parent
# A capgate served over HTTP: the gateway fixture (uvicorn in a thread), Django's live_server.
LIVE_FIXTURES = {"gateway", "live_server"}
# Modules that start gateway subprocesses themselves (tests/faults/conftest.py gateway_process).
LIVE_NAMES = ("gateway_process",)
# Slow but neither live nor faults: each costs seconds on its own, by design (a file, or one test).
SLOW = {
    "api/test_schemathesis.py": "generates hundreds of requests per operation from the schema",
    "ledger/test_admission_races.py": "hundreds of threads on real connections, each race widened",
    "ledger/test_slices.py": "races processes on one ceiling",
    "ledger/test_tasks.py": "starts a real Celery worker with beat",
    "catalog/test_genai_prices.py": "loads the whole genai-prices catalog into the database",
    "alerts/test_audit.py::test_manage_py_audit_exits_1_on_drift": "runs manage.py in a subprocess",
    "gateway/test_health_metrics.py::test_metrics_from_two_uvicorn_workers_count_both": "two uvicorn workers",
    "upstream/test_server.py::test_runs_as_a_module": "the fake upstream as its own process",
    "deploy/test_wheel.py": "builds the wheel and installs it in a fresh environment",
    "deploy/test_static_files.py": "collectstatic and Django processes under the production settings",
    "pgbouncer/test_money_through_pgbouncer.py": "hundreds of admissions through the pooler, and a recall",
    "gateway/test_exact_counts.py::test_fuzz_exact_count_never_below_what_the_tokenizer_bills": "300 generated prompts",
    "gateway/test_echo_jobs.py::test_a_job_created_in_one_process_is_read_in_another": "a second Python process",
}
# Besides tests/clients and tests/browser, what runs in the whole suite's second lane, beside the
# fault tests (scripts/test.sh): modules whose minutes are mostly a wait on a timer, or that keep
# the second core busy while the main lane holds the first. Measured per module with
# `pytest --junitxml` (docs/decisions.md, "The whole suite runs in two lanes").
SECOND_LANE = {
    "gateway/test_exact_counts_burst.py": "each burst is held 20 s at the fake upstream (about 30 s a test)",
    "gateway/test_exact_counts_responses.py": "the same bursts on the Responses API (about 30 s a test)",
    "gateway/test_upstream_capacity.py": "hung upstream calls, waited out",
    "capcheck/test_kinds.py": "the core scenarios at 200 concurrent on every kind (85 s)",
}


# Emptying the database after each transactional test (`transactional_db`, the gateway fixture):
# Django's flush is one TRUNCATE of every table, then the post_migrate signal, which recreates every
# content type and permission. TRUNCATE makes new files for each table and index and waits for
# their fsync: 0.2-0.6 s a test here, against a few milliseconds for DELETE on the handful of rows a
# test leaves. The end state is the same: every table empty (no sequence is reset either way) but
# the content types and permissions, which keep the rows post_migrate recreated at the session's
# first flush (a Django flush, as is any flush after a test changed them). Django's foreign keys
# are deferrable, so one transaction empties the tables in any order.
_django_flush = TransactionTestCase._fixture_teardown
_STATIC_TABLES = ("django_content_type", "auth_permission")
_static_rows: dict[str, dict[str, list[tuple]]] = {}


def _static_snapshot(cursor) -> dict[str, list[tuple]]:
    rows = {}
    for table in _STATIC_TABLES:
        cursor.execute(f"SELECT * FROM {table} ORDER BY id")
        rows[table] = cursor.fetchall()
    return rows


def _delete_all_rows(self: TransactionTestCase) -> None:
    if self.available_apps is not None or self.serialized_rollback:
        return _django_flush(self)
    for alias in self._databases_names(include_mirrors=False):
        conn = connections[alias]
        if conn.vendor == "postgresql" and alias in _static_rows:
            tables = conn.introspection.django_table_names(only_existing=True, include_views=False)
            with transaction.atomic(using=alias), conn.cursor() as cursor:
                cursor.execute("SET CONSTRAINTS ALL DEFERRED")
                cursor.execute(
                    "; ".join(
                        f"DELETE FROM {conn.ops.quote_name(t)}" for t in sorted(tables) if t not in _STATIC_TABLES
                    )
                )
                if _static_snapshot(cursor) == _static_rows[alias]:
                    continue
        from django.contrib.contenttypes.models import ContentType

        # Django's flush of this database (the first of the session, or a test changed the content
        # types or permissions), and what post_migrate recreated, which the next DELETEs keep.
        call_command(
            "flush", verbosity=0, interactive=False, database=alias, reset_sequences=False, allow_cascade=False
        )
        ContentType.objects.clear_cache()
        if conn.vendor == "postgresql":
            with conn.cursor() as cursor:
                _static_rows[alias] = _static_snapshot(cursor)


# The test database at the session's end: DROP DATABASE forces an immediate checkpoint of the whole
# cluster (every database's dirty buffers, the other runs' included), 2-12 s here that the run
# waited for. It is renamed instead (instant; it fails, as DROP would, while anything is connected),
# and a detached process drops it, and any renamed one an earlier run left, after the run.
_DROP_SCRIPT = """
import os, sys
import psycopg
from psycopg import sql
with psycopg.connect(os.environ["CAPGATE_DROP_CONNINFO"], autocommit=True) as conn:
    names = [r[0] for r in conn.execute(
        "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (sys.argv[1],))]
    for name in names:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
"""


def _destroy_test_db_later(self: DatabaseCreation, test_database_name: str, verbosity: int) -> None:
    from psycopg.conninfo import make_conninfo

    self.connection.close_pool()
    prefix = f"{test_database_name[:30]}_dropped_"
    trash = f"{prefix}{os.getpid()}_{int(time.time())}"
    with self._nodb_cursor() as cursor:
        quote = self.connection.ops.quote_name
        cursor.execute(f"ALTER DATABASE {quote(test_database_name)} RENAME TO {quote(trash)}")
        info = self.connection.get_connection_params()
    conninfo = make_conninfo(
        **{k: str(v) for k, v in info.items() if k in ("host", "port", "user", "password") and v}, dbname="postgres"
    )
    subprocess.Popen(
        [sys.executable, "-c", _DROP_SCRIPT, prefix],
        env={**os.environ, "CAPGATE_DROP_CONNINFO": conninfo},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def pytest_configure(config):
    # Only transactional tests flush: TestCase (the `db` fixture) rolls back instead.
    TransactionTestCase._fixture_teardown = _delete_all_rows
    DatabaseCreation._destroy_test_db = _destroy_test_db_later
    # An entry naming no file (a move, a rename) would put a slow test in the fast tier unseen.
    for name, entries in (("SLOW", SLOW), ("SECOND_LANE", SECOND_LANE)):
        gone = [entry for entry in entries if not (TESTS / entry.split("::")[0]).is_file()]
        if gone:
            raise pytest.UsageError(f"tests/conftest.py {name} names files that do not exist: {gone}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
        top = rel.split("/", 1)[0]
        live = bool(LIVE_FIXTURES & set(getattr(item, "fixturenames", ()))) or any(
            hasattr(getattr(item, "module", None), name) for name in LIVE_NAMES
        )
        if top == "faults":
            item.add_marker(pytest.mark.faults)
        if top in ("clients", "browser") or rel in SECOND_LANE:
            item.add_marker(pytest.mark.second_lane)
        if top == "browser":
            item.add_marker(pytest.mark.browser)
        if live or top in ("faults", "browser"):
            item.add_marker(pytest.mark.live)
        node = rel + "::" + item.name.split("[")[0]
        if live or top in ("faults", "browser", "clients") or rel in SLOW or node in SLOW:
            item.add_marker(pytest.mark.slow)
