"""The request log shows how each admitted request's prompt was bounded: "exact" or
"bytes". A view can only gain columns at its end, so the column is appended."""

import importlib

from django.db import migrations

_initial = importlib.import_module("requestlog.migrations.0001_initial")
_OLD_VIEW = next(op.sql for op in _initial.Migration.operations if isinstance(op, migrations.RunSQL))

VIEW = """
CREATE OR REPLACE VIEW requestlog_entry AS
SELECT u.request_id, 'usage'::varchar(10) AS source, u.id AS row_id, u.organization_id,
       u.project_id, u.member_id, u.api_key_id, u.end_customer_id, u.connection_id,
       NULL::bigint AS budget_id, u.run_id, u.model, u.provider_model, u.status,
       ''::varchar(100) AS code, NULL::smallint AS http_status, u.input_tokens,
       u.output_tokens, u.reserved_nano, u.cost_nano, u.excess_nano, u.latency_ms,
       u.error AS message, u.admitted_at AS at, u.input_bound
  FROM usage_usagerecord u
UNION ALL
SELECT r.request_id, 'refusal'::varchar(10), r.id, r.organization_id,
       r.project_id, r.member_id, r.api_key_id, r.end_customer_id, NULL::bigint,
       r.budget_id, NULLIF(r.run_id, ''), r.model, ''::varchar(200), r.status,
       r.code, r.http_status, 0::bigint,
       0::bigint, r.reserved_nano, 0::bigint, 0::bigint, r.latency_ms,
       r.message, r.created_at, ''::varchar(5)
  FROM requestlog_refusal r
"""


class Migration(migrations.Migration):
    dependencies = [
        ("requestlog", "0001_initial"),
        ("usage", "0005_usage_input_bound"),
    ]

    operations = [
        migrations.RunSQL(sql=VIEW, reverse_sql="DROP VIEW IF EXISTS requestlog_entry;" + _OLD_VIEW),
    ]
