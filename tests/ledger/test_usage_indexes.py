"""Each index on the usage table is written by every record's insert and again by its drain, so
each must earn that: the table's indexes are exactly the justified ones below, and the queries and
cascades by a subject column are served by the composite index that column leads."""

import json

from django.db import connection
from django.utils import timezone

from ledger.models import UsageRecord

# index -> what reads it
JUSTIFIED = {
    "usage_usagerecord_pkey": "the primary key",
    "usage_usagerecord_request_id_key": "one record per request id (exact lookups, ON CONFLICT)",
    "usage_usagerecord_project_id_242eeb72": "project pages, and the cascade when a project is deleted",
    "usage_usagerecord_member_id_4de1a919": "the cascade when a member is removed",
    "usage_usagerecord_connection_id_14db2b9e": "the cascade when a connection is deleted",
    "usage_outbox_idx": "the drain's outbox scan",
    "usage_usage_organiz_52a165_idx": "an organization's records by time: pages, exports, window seeds",
    "usage_usage_end_cus_93fb8a_idx": "an end customer's records by time, and its cascade",
    "usage_usage_api_key_f3a349_idx": "a key's records by time, and its cascade",
    "usage_report_mismatch_idx": "the per-request audit",
    "usage_run_idx": "a run window's seed",
    "usage_status_time_idx": "a request-log page of a rare status (not served), newest first",
}


def _indexes() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'usage_usagerecord'")
        return {row[0] for row in cursor.fetchall()}


def test_every_index_on_the_usage_table_is_justified(db):
    assert _indexes() == set(JUSTIFIED)


def test_a_subject_columns_lookups_use_the_composite_index_it_leads(acme):
    now = timezone.now()
    UsageRecord.objects.bulk_create(
        UsageRecord(
            organization=acme.org,
            api_key=acme.key,
            request_id=f"r-{i}",
            status=UsageRecord.Status.SERVED,
            admitted_at=now,
            applied=True,
        )
        for i in range(2000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE usage_usagerecord")
        cursor.execute("SET LOCAL enable_seqscan = off")
        for column, index in [
            ("organization_id", "usage_usage_organiz_52a165_idx"),
            ("api_key_id", "usage_usage_api_key_f3a349_idx"),
            ("end_customer_id", "usage_usage_end_cus_93fb8a_idx"),
        ]:
            # the shape of the ORM's SET NULL cascade and of a subject's filter
            cursor.execute(f"EXPLAIN (FORMAT JSON) SELECT id FROM usage_usagerecord WHERE {column} = %s", [acme.org.id])
            assert index in json.dumps(cursor.fetchone()[0]), column


def test_deleting_a_key_keeps_its_records(acme):
    UsageRecord.objects.create(
        organization=acme.org, api_key=acme.key, request_id="kept", status="served", admitted_at=timezone.now()
    )
    acme.key.delete()
    assert UsageRecord.objects.get(request_id="kept").api_key_id is None
