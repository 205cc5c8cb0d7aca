"""Settings for a database reached through a transaction-mode pooler (PgBouncer, pool_mode =
transaction), as production Postgres often is (docs/operations.md, "PgBouncer").

Such a pooler lends a client a server connection for one transaction only; the next transaction
may run on another server connection. So nothing capgate uses may outlive a transaction on the
server side:

- Server-side cursors (`QuerySet.iterator()` opens a named cursor in the session): off, so
  Django fetches in chunks on the client instead.
- Prepared statements (prepared in one server session, executed in another): off
  (`prepare_threshold` None), behind a pooler that does not track them (PgBouncer before 1.21;
  Debian 12 ships 1.18). On a direct connection they are on (`DIRECT_PREPARE_THRESHOLD`): the
  only statements psycopg can prepare are the ones bound on the server, which is the group
  commit's one constant text (ledger/recording.py); Django's own cursors bind on the client and
  are never prepared. Prepared, the group commit is planned once per connection instead of on
  every batch (about a millisecond of planning, docs/performance.md).
- LISTEN (a subscription of the session): the headroom slices' recall listener needs a session
  of its own, so behind a transaction pooler it connects directly to Postgres
  (CAPGATE_LISTEN_DATABASE_URL). Without one, settings refuse to load while slices are on: a
  LISTEN through the pooler is accepted and then hears nothing, so another process's refusal
  would never recall this one's slices (room held until each slice's time runs out).

Session-level SET is not used (only SET LOCAL, which ends with its transaction); the time zone
Django sets on each connection is a parameter PgBouncer tracks and re-applies for each client.
Django's own pool (CONN_MAX_AGE stays 0, as the pool requires) keeps working in front of the
pooler: its connections are client connections to PgBouncer, cheap to hold.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured

TRANSACTION = "transaction"
POOLERS = ("", TRANSACTION)
# psycopg prepares a server-bound statement on its third execution on a connection: a statement
# run once or twice (a replay, a test) is not worth a round trip to prepare.
DIRECT_PREPARE_THRESHOLD = 2


def for_transaction_pooler(database: dict[str, Any]) -> dict[str, Any]:
    """`database` (a DATABASES entry) with what a transaction-mode pooler needs."""
    return {
        **database,
        "DISABLE_SERVER_SIDE_CURSORS": True,
        "OPTIONS": {**database.get("OPTIONS", {}), "prepare_threshold": None},
    }


def for_direct_connection(database: dict[str, Any]) -> dict[str, Any]:
    """`database` with server-bound statements prepared (Django's backend turns them off)."""
    return {**database, "OPTIONS": {**database.get("OPTIONS", {}), "prepare_threshold": DIRECT_PREPARE_THRESHOLD}}


def database(*, pooler: str, default: dict[str, Any]) -> dict[str, Any]:
    """The default DATABASES entry for CAPGATE_DB_POOLER's value ("" for a direct connection)."""
    if pooler not in POOLERS:
        raise ImproperlyConfigured(f"CAPGATE_DB_POOLER must be one of {POOLERS!r}, not {pooler!r}")
    return for_transaction_pooler(default) if pooler == TRANSACTION else for_direct_connection(default)


def listen_database(*, pooler: str, direct: dict[str, Any] | None, slices: bool) -> dict[str, Any] | None:
    """The database the slices' LISTEN connection uses (None: the default database's)."""
    if direct is None and pooler == TRANSACTION and slices:
        raise ImproperlyConfigured(
            "CAPGATE_DB_POOLER=transaction with headroom slices on needs CAPGATE_LISTEN_DATABASE_URL: a "
            "direct (session) connection to Postgres for the slices' LISTEN, which a transaction pooler "
            "does not carry. Set it, or turn slices off with CAPGATE_SLICES=false."
        )
    return direct
