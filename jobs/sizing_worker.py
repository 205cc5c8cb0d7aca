"""The entry points of a sizing process (jobs/uploads.py). Its initializer runs before Django is
set up, so this module imports no models at import time."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError

T = TypeVar("T")
NICENESS = 10  # below the gateway's own priority: the process serving requests comes first


def start(database: dict) -> None:
    """Set up Django on the gateway's database (the one it runs on, a test database included),
    with no connection pool of its own: one connection, held between uploads."""
    os.nice(NICENESS)
    import django

    django.setup()
    from django.db import connections

    connections.close_all()
    connections.settings = connections.configure_settings({"default": database})
    for alias in list(connections):
        try:
            del connections[alias]  # a wrapper set up before holds the old settings
        except AttributeError:
            pass


def run(fn: Callable[..., T], kwargs: dict) -> T:
    from django.db import connection

    try:
        return fn(**kwargs)
    except DatabaseError as exc:  # psycopg's errors do not cross the process boundary: its message does
        connection.close()
        raise DatabaseError(str(exc)) from None
