from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built concurrently: usage_usagerecord is the largest table, and a plain CREATE INDEX would
    # block the gateway's record writes for the whole build.
    atomic = False

    dependencies = [
        ("ledger", "0007_usage_drop_redundant_indexes"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="usagerecord",
            index=models.Index(
                condition=~models.Q(status="served"),
                fields=["organization", "status", "admitted_at"],
                name="usage_status_time_idx",
            ),
        ),
    ]
