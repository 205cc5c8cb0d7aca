import django.db.models.deletion
from django.db import migrations, models

# Single-column indexes on usage_usagerecord that only cost writes: each of these three columns
# leads a composite index ((organization, admitted_at), (api_key, admitted_at), (end_customer,
# admitted_at)) that serves every query and every cascade by it; the request id's pattern-ops
# index serves LIKE, which nothing runs on it (lookups are exact, through its unique index).
# Dropped concurrently: the table is the largest and a plain DROP INDEX waits for, and then
# blocks, every record write. The names are the ones Django gave them (deterministic).
REDUNDANT = [
    ("usage_usagerecord_organization_id_d2c8a75f", "(organization_id)"),
    ("usage_usagerecord_api_key_id_93ec9f60", "(api_key_id)"),
    ("usage_usagerecord_end_customer_id_6a3786cb", "(end_customer_id)"),
    ("usage_usagerecord_request_id_adea5b8d_like", "(request_id varchar_pattern_ops)"),
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0006_budget_notice_subject"),
        ("tenants", "0006_retention_age_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="usagerecord",
                    name=name,
                    field=models.ForeignKey(
                        blank=nullable,
                        db_index=False,
                        null=nullable,
                        on_delete=on_delete,
                        related_name="+",
                        to=to,
                    ),
                )
                for name, to, on_delete, nullable in [
                    ("api_key", "tenants.apikey", django.db.models.deletion.SET_NULL, True),
                    ("end_customer", "tenants.endcustomer", django.db.models.deletion.SET_NULL, True),
                    ("organization", "tenants.organization", django.db.models.deletion.CASCADE, False),
                ]
            ],
            database_operations=[
                migrations.RunSQL(
                    f"DROP INDEX CONCURRENTLY IF EXISTS {index}",
                    reverse_sql=f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON usage_usagerecord {columns}",
                )
                for index, columns in REDUNDANT
            ],
        ),
    ]
