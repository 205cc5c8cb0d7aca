"""/readyz answers within READYZ_TIMEOUT_SECONDS when the database does not: a 503 naming it,
not a probe that hangs until the orchestrator gives up."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from django.db import connections

from gateway.upstream import runtime

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def silent_database(gateway) -> Iterator[None]:
    """The gateway's database threads pointed at a port that accepts connections and never
    answers: a connect hangs there, as behind a dropped route or a stuck server."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        db_settings = connections.settings["default"]
        saved = db_settings["PORT"], db_settings.get("OPTIONS", {})
        db_settings["PORT"] = listener.getsockname()[1]
        db_settings["OPTIONS"] = {**saved[1], "connect_timeout": 4}  # the hang ends, after the bound
        runtime.close_thread_connections()
        try:
            yield
        finally:
            db_settings["PORT"], db_settings["OPTIONS"] = saved
            time.sleep(4.5)  # the probe thread's hanging connect ends before its connection is closed
            runtime.close_thread_connections()


def test_readyz_answers_503_naming_the_database_within_the_bound(gateway, silent_database, settings):
    settings.CAPGATE = {**settings.CAPGATE, "READYZ_TIMEOUT_SECONDS": 0.5}
    # when: two probes, the second while the first's check still hangs
    for _ in range(2):
        began = time.monotonic()
        resp = httpx.get(gateway.url + "/readyz", timeout=3)
        took = time.monotonic() - began
        # then
        assert resp.status_code == 503 and took < 1.5, took
        body = resp.json()
        assert body["failing"] == ["database", "migrations"]
        assert body["checks"]["database"] == "failing: no answer within 0.5 s"
        assert body["checks"]["spool"] == "ok"


def test_removal_without_the_bound_the_probe_hangs(gateway, silent_database, settings):
    settings.CAPGATE = {**settings.CAPGATE, "READYZ_TIMEOUT_SECONDS": 60.0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(gateway.url + "/readyz", timeout=2)
