"""GET /v1/files: the organization's own files, paginated the way OpenAI paginates them, as the
official SDK's `client.files.list()` reads them; another organization's files never appear."""

from __future__ import annotations

import httpx
import pytest

from jobs.models import JobFile
from tenants.models import ApiKey, hash_key
from tests.conftest import make_tenant
from tests.gateway.conftest import KEY
from tests.jobs.conftest import oa, upload

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_sdk_lists_and_pages_the_organizations_files(gateway, jobs_org):
    # given: three uploads, and an outsider's file in the same deployment
    client = oa(gateway)
    ids = [upload(client, 1).id for _ in range(3)]
    outsider = make_tenant("globex")
    JobFile.objects.create(organization=outsider.org, file_id="file-outsider", purpose="batch")
    # when: the SDK lists them (newest first) and follows its cursor two at a time
    listed = [f.id for f in client.files.list()]
    paged = [f.id for f in client.files.list(limit=2)]  # the SDK's iterator follows has_more / after
    oldest_first = [f.id for f in client.files.list(order="asc")]
    # then
    assert listed == ids[::-1] == paged
    assert oldest_first == ids
    first_page = client.files.list(limit=2)
    assert (first_page.has_more, len(first_page.data)) == (True, 2)
    assert first_page.data[0].purpose == "batch" and first_page.data[0].bytes > 0
    assert "file-outsider" not in listed


def test_the_outsider_lists_only_its_own_files(gateway, jobs_org):
    upload(oa(gateway), 1)
    outsider = make_tenant("globex")
    raw = "cg_outsider_key_0123456789"
    ApiKey.objects.filter(pk=outsider.key.pk).update(key_hash=hash_key(raw))
    resp = httpx.get(gateway.url + "/v1/files", headers={"authorization": f"Bearer {raw}"})
    assert resp.status_code == 200
    assert resp.json() == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


@pytest.mark.parametrize("query", ["limit=0", "limit=10001", "limit=ten", "order=sideways"])
def test_a_bad_list_query_is_a_400_in_openais_shape(gateway, jobs_org, query):
    resp = httpx.get(gateway.url + f"/v1/files?{query}", headers={"authorization": f"Bearer {KEY}"})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == query.split("=")[0]
