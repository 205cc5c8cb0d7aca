"""Settings for a database behind a transaction-mode pooler (config/settings/pooling.py): what
CAPGATE_DB_POOLER=transaction changes, and that slices refuse to load without a direct LISTEN
connection there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.settings import pooling

ROOT = Path(__file__).resolve().parents[2]
DIRECT = "postgres://capgate:capgate@127.0.0.1:15432/capgate"
POOLED = "postgres://capgate:capgate@127.0.0.1:16432/capgate"


def _settings(**env: str) -> str:
    """The database settings `config.settings.base` loads from `env`, printed by a fresh process."""
    code = (
        "from config.settings import base; d = base.DATABASES['default']; "
        "print(d['PORT'], d.get('DISABLE_SERVER_SIDE_CURSORS', False), "
        "'prepare_threshold' in d['OPTIONS'] and d['OPTIONS']['prepare_threshold'], d['CONN_MAX_AGE'], "
        "(base.CAPGATE['LISTEN_DATABASE'] or {}).get('PORT'))"
    )
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("CAPGATE_", "DATABASE_URL"))}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**keep, **env}, capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip() if done.returncode == 0 else done.stderr.strip().splitlines()[-1]


def test_a_direct_connection_prepares_server_bound_statements_and_keeps_the_rest_of_djangos_defaults():
    assert _settings(DATABASE_URL=DIRECT) == f"15432 False {pooling.DIRECT_PREPARE_THRESHOLD} 0 None"


def test_transaction_pooling_turns_off_server_side_cursors_and_prepared_statements():
    out = _settings(DATABASE_URL=POOLED, CAPGATE_DB_POOLER="transaction", CAPGATE_LISTEN_DATABASE_URL=DIRECT)
    # the pool stays (CONN_MAX_AGE 0, as Django's pool requires); LISTEN goes direct
    assert out == "16432 True None 0 15432"


def test_transaction_pooling_with_slices_and_no_direct_listen_connection_refuses_to_load():
    out = _settings(DATABASE_URL=POOLED, CAPGATE_DB_POOLER="transaction")
    assert out.startswith("django.core.exceptions.ImproperlyConfigured: CAPGATE_DB_POOLER=transaction")
    assert "CAPGATE_LISTEN_DATABASE_URL" in out
    # with slices off nothing LISTENs, so no direct connection is needed
    out = _settings(DATABASE_URL=POOLED, CAPGATE_DB_POOLER="transaction", CAPGATE_SLICES="false")
    assert out == "16432 True None 0 None"


def test_an_unknown_pooler_is_refused():
    with pytest.raises(ImproperlyConfigured, match="CAPGATE_DB_POOLER"):
        pooling.database(pooler="session", default={"OPTIONS": {}})
