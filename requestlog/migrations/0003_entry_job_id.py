"""The request log links a provider job to the request that submitted it: the
usage record's `job_id`, appended at the view's end (a view can only gain columns there)."""

import importlib

from django.db import migrations

_previous = importlib.import_module("requestlog.migrations.0002_entry_input_bound")

VIEW = """
CREATE OR REPLACE VIEW requestlog_entry AS
SELECT u.request_id, 'usage'::varchar(10) AS source, u.id AS row_id, u.organization_id,
       u.project_id, u.member_id, u.api_key_id, u.end_customer_id, u.connection_id,
       NULL::bigint AS budget_id, u.run_id, u.model, u.provider_model, u.status,
       ''::varchar(100) AS code, NULL::smallint AS http_status, u.input_tokens,
       u.output_tokens, u.reserved_nano, u.cost_nano, u.excess_nano, u.latency_ms,
       u.error AS message, u.admitted_at AS at, u.input_bound, u.job_id
  FROM usage_usagerecord u
UNION ALL
SELECT r.request_id, 'refusal'::varchar(10), r.id, r.organization_id,
       r.project_id, r.member_id, r.api_key_id, r.end_customer_id, NULL::bigint,
       r.budget_id, NULLIF(r.run_id, ''), r.model, ''::varchar(200), r.status,
       r.code, r.http_status, 0::bigint,
       0::bigint, r.reserved_nano, 0::bigint, 0::bigint, r.latency_ms,
       r.message, r.created_at, ''::varchar(5), NULL::varchar(200)
  FROM requestlog_refusal r
"""


class Migration(migrations.Migration):
    dependencies = [
        ("requestlog", "0002_entry_input_bound"),
        ("usage", "0006_usagerecord_job_id"),
    ]

    operations = [
        migrations.RunSQL(sql=VIEW, reverse_sql="DROP VIEW IF EXISTS requestlog_entry;" + _previous.VIEW),
    ]
