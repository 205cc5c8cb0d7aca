"""State only: alert events point at the ledger's Budget and Window (same tables, same foreign
keys in the database), and UsageRecord left this app for the ledger (its table stays).
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0001_initial'),
        ('usage', '0008_usagerecord_conflicting_cost'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='alertevent',
                    name='budget',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alert_events', to='ledger.budget'),
                ),
                migrations.AlterField(
                    model_name='alertevent',
                    name='window',
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alert_events', to='ledger.window'),
                ),
                migrations.DeleteModel(
                    name='UsageRecord',
                ),
            ],
            database_operations=[],
        ),
    ]
