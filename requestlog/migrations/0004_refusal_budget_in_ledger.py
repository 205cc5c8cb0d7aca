"""State only: a refusal points at the ledger's Budget (same table, same foreign key).
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0001_initial'),
        ('requestlog', '0003_entry_job_id'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='refusal',
                    name='budget',
                    field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='ledger.budget'),
                ),
            ],
            database_operations=[],
        ),
    ]
