"""The dashboard and the API keep a reserved slice of the database pool: a gateway process whose
database threads hold every connection they may have still answers management requests
(issue 9, item 4). A real uvicorn process with the production pool, on the test database."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.faults.conftest import database_url, gateway_process

pytestmark = pytest.mark.django_db(transaction=True)
CONCURRENT = 6


def management_calls(url: str, slug: str, token: str) -> list[int]:
    """CONCURRENT management API calls at once, while the gateway's threads hold their connections
    (they open them all at startup and keep them), plus gateway traffic on top."""

    def call(i: int) -> int:
        if i % 2:  # gateway traffic keeps its threads busy at the same time
            httpx.get(url + "/v1/models", headers={"authorization": "Bearer cg_unknown"}, timeout=10)
        return httpx.get(
            f"{url}/api/orgs/{slug}/budgets/", headers={"authorization": f"Bearer {token}"}, timeout=10
        ).status_code

    with ThreadPoolExecutor(CONCURRENT) as pool:
        return list(pool.map(call, range(CONCURRENT)))


def run(org_a, tmp_path, web_connections: int) -> list[int]:
    env = {
        "CAPGATE_DB_POOL_MAX": "8",
        "CAPGATE_DB_WEB_CONNECTIONS": str(web_connections),
        "CAPGATE_DB_POOL_TIMEOUT": "1",
    }
    with gateway_process(database=database_url(), data_dir=tmp_path, env=env) as gw:
        return management_calls(gw.url, org_a.slug, org_a.token_read)


def test_management_requests_succeed_while_the_gateway_holds_its_connections(org_a, tmp_path):
    assert run(org_a, tmp_path, web_connections=3) == [200] * CONCURRENT


def test_without_the_reserved_slice_management_requests_time_out(org_a, tmp_path):
    # Guard removed: no slice, the gateway's 8 threads take the whole pool of 8.
    statuses = run(org_a, tmp_path, web_connections=0)
    assert all(s == 500 for s in statuses), statuses
