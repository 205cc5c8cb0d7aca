"""Real concurrency for tests: N threads, each with its own database connection, released
together by a barrier."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.db import connection

T = TypeVar("T")


def race(n: int, fn: Callable[[int], T], *, timeout: float = 120) -> list[T]:
    """Run fn(0..n-1) in n threads released at once. Each thread opens its connection before
    the barrier (so connecting does not serialize the start) and closes it afterwards."""
    barrier = threading.Barrier(n, timeout=timeout)

    def run(i: int) -> T:
        try:
            connection.ensure_connection()
            barrier.wait()
            return fn(i)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(run, range(n), timeout=timeout))
