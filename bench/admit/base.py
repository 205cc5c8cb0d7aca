"""What the admission benchmark needs before `django.setup()` (so nothing here imports a model):
paths, the runners' names, its database and the Django setup."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent.parent
PGBENCH_DIR = ROOT / "bench" / "pgbench"
DEFAULT_DB_URL = "postgres://capgate:capgate@127.0.0.1:15432/capgate_bench"
RUNNERS = ("threads", "processes", "leases", "leases-cached", "pgbench", "pgbench-admit")
# What-ifs, run only when named in --runners.
OPT_IN = ("leases-cached",)


@dataclass(frozen=True)
class Db:
    host: str
    port: int
    user: str
    password: str
    name: str


def parse_db_url(url: str) -> Db:
    u = urlsplit(url)
    return Db(
        host=u.hostname or "127.0.0.1",
        port=u.port or 5432,
        user=unquote(u.username or ""),
        password=unquote(u.password or ""),
        name=u.path.lstrip("/"),
    )


def create_database(db: Db) -> None:
    if db.name == "capgate" or db.name.startswith("test_") or not db.name:
        sys.exit(f"refusing to benchmark in database {db.name!r}: use a dedicated one (e.g. capgate_bench)")
    with psycopg.connect(
        host=db.host,
        port=db.port,
        user=db.user,
        password=db.password,
        dbname="postgres",
        autocommit=True,
    ) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db.name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db.name)))


def setup_django(args: argparse.Namespace) -> None:
    max_clients = max([*args.clients, *args.cycle_clients, *(args.whatif_clients if args.whatif else []), 1])
    os.environ["DATABASE_URL"] = args.db_url
    os.environ["DJANGO_SETTINGS_MODULE"] = args.settings
    # Production settings refuse to start without real secrets; the bench is loopback-only.
    os.environ.setdefault("DJANGO_SECRET_KEY", "capgate-bench-only-django-secret-key-never-deployed-0")
    os.environ.setdefault("CAPGATE_SECRET_KEY", "capgate-bench-only-connection-secret-key")
    # Every thread holds its own pooled connection for a whole cell (plus the drainer and main).
    os.environ["CAPGATE_DB_POOL_MAX"] = str(max_clients + 4)
    os.environ["CAPGATE_DB_POOL_MIN"] = "1"
    # Opening 64 connections on a busy 2-core machine can take longer than the default 10 s.
    os.environ["CAPGATE_DB_POOL_TIMEOUT"] = "120"
    sys.path.insert(0, str(ROOT))
    import django  # here, not at the top: the environment above must be set first

    django.setup()
    from django.core.management import call_command  # needs the settings configured above

    call_command("migrate", verbosity=0)


def migrated_django(db_url: str) -> None:
    """A dedicated benchmark database, created if missing, migrated, with Django set up on it."""
    create_database(parse_db_url(db_url))
    os.environ["DATABASE_URL"] = db_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.base"
    os.environ.setdefault("DJANGO_SECRET_KEY", "capgate-bench-only-django-secret-key-never-deployed-0")
    os.environ.setdefault("CAPGATE_SECRET_KEY", "capgate-bench-only-connection-secret-key")
    import django  # here, not at the top: the environment above must be set first

    django.setup()
    from django.core.management import call_command  # needs the settings configured above

    call_command("migrate", verbosity=0)
