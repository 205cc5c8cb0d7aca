from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built concurrently: usage_usagerecord is the largest table, and a plain CREATE INDEX would
    # block the gateway's record writes for the whole build.
    atomic = False

    dependencies = [
        ("catalog", "0011_model_fast_mode_multiplier"),
        ("ledger", "0002_budget_notices"),
        ("tenants", "0004_audit_without_organization"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="usagerecord",
            index=models.Index(
                condition=models.Q(("run_id__isnull", False)), fields=["organization", "run_id"], name="usage_run_idx"
            ),
        ),
    ]
