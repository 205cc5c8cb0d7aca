"""Per-organization bounds on POST /v1/files (jobs/uploads.py): uploads at once (429) and stored
bytes (413), each refused in OpenAI's error shape with nothing stored or sent to the provider."""

from __future__ import annotations

import openai
import pytest

from jobs import uploads
from jobs.models import JobFile
from tests.jobs.conftest import batch_file, oa, upload


def test_an_upload_past_the_orgs_concurrent_uploads_is_refused_with_429(gateway, jobs_org, upstream, settings):
    # given: the organization already runs its one allowed upload in this process
    settings.CAPGATE = {**settings.CAPGATE, "ORG_CONCURRENT_UPLOADS": 1}
    assert uploads.running.take(jobs_org.org.id, 1)
    try:
        # when
        with pytest.raises(openai.RateLimitError) as err:
            upload(oa(gateway), 3)
    finally:
        uploads.running.give(jobs_org.org.id)
    # then: 429 in OpenAI's shape, nothing stored, nothing sent
    assert err.value.status_code == 429
    body = err.value.body
    assert body["code"] == "too_many_concurrent_uploads" and body["message"] and "type" in body
    assert not JobFile.objects.exists()
    assert upstream.stats()["by_path"].get("/v1/files", 0) == 0
    # and once the slot is free, the same upload is taken
    assert upload(oa(gateway), 3).id


def test_an_upload_past_the_orgs_stored_bytes_is_refused_with_413(gateway, jobs_org, upstream, settings):
    # given: room for one small file and not two
    first = len(batch_file(3).getvalue())
    settings.CAPGATE = {**settings.CAPGATE, "ORG_STORED_FILE_BYTES": first * 3 // 2 + 200}
    kept = upload(oa(gateway), 3)
    stored = JobFile.objects.get().size_bytes
    # when: a second one would pass the quota
    with pytest.raises(openai.APIStatusError) as err:
        upload(oa(gateway), 3)
    # then: 413 in OpenAI's shape; only the first file is stored and sent
    assert err.value.status_code == 413
    body = err.value.body
    assert body["code"] == "file_storage_quota" and body["param"] == "file" and body["message"]
    assert list(JobFile.objects.values_list("file_id", flat=True)) == [kept.id]
    assert upstream.stats()["by_path"].get("/v1/files", 0) == 1
    # and an organization at its quota is refused before its body is read
    settings.CAPGATE = {**settings.CAPGATE, "ORG_STORED_FILE_BYTES": stored}
    with pytest.raises(openai.APIStatusError) as err:
        upload(oa(gateway), 1)
    assert err.value.status_code == 413 and JobFile.objects.count() == 1


def test_deleting_a_file_gives_its_bytes_back(gateway, jobs_org, settings):
    first = upload(oa(gateway), 3)
    settings.CAPGATE = {**settings.CAPGATE, "ORG_STORED_FILE_BYTES": JobFile.objects.get().size_bytes}
    with pytest.raises(openai.APIStatusError):
        upload(oa(gateway), 3)
    oa(gateway).files.delete(first.id)
    assert upload(oa(gateway), 3).id
