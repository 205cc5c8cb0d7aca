import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built concurrently: the refusal table takes the gateway's batched writes all the time.
    # Then the key's and the customer's own indexes go: the (key, time) and (customer, time)
    # ones lead with the same column (and the planner took the narrow one and sorted).
    atomic = False

    dependencies = [
        ("requestlog", "0004_refusal_budget_in_ledger"),
        ("tenants", "0005_bind_api_tokens_to_members"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="refusal",
            index=models.Index(fields=["api_key", "created_at"], name="refusal_key_time_idx"),
        ),
        AddIndexConcurrently(
            model_name="refusal",
            index=models.Index(fields=["end_customer", "created_at"], name="refusal_customer_time_idx"),
        ),
        AddIndexConcurrently(
            model_name="refusal",
            index=models.Index(
                condition=~models.Q(run_id=""),
                fields=["organization", "run_id", "created_at"],
                name="refusal_run_time_idx",
            ),
        ),
        migrations.AlterField(
            model_name="refusal",
            name="api_key",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="tenants.apikey",
            ),
        ),
        migrations.AlterField(
            model_name="refusal",
            name="end_customer",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="tenants.endcustomer",
            ),
        ),
    ]
