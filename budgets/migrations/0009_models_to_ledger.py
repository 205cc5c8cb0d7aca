"""State only: Budget, Window, GatewayInstance, Reservation and Hold left this app for the ledger
(ledger/migrations/0001_initial.py); their tables stay, with their names and data.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('budgets', '0008_window_blocking'),
        ('ledger', '0001_initial'),
        ('requestlog', '0004_refusal_budget_in_ledger'),
        ('usage', '0009_usagerecord_to_ledger'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='budget',
                    name='api_key',
                ),
                migrations.RemoveField(
                    model_name='budget',
                    name='end_customer',
                ),
                migrations.RemoveField(
                    model_name='budget',
                    name='member',
                ),
                migrations.RemoveField(
                    model_name='budget',
                    name='organization',
                ),
                migrations.RemoveField(
                    model_name='budget',
                    name='project',
                ),
                migrations.RemoveField(
                    model_name='window',
                    name='budget',
                ),
                migrations.RemoveField(
                    model_name='reservation',
                    name='owner',
                ),
                migrations.RemoveField(
                    model_name='hold',
                    name='reservation',
                ),
                migrations.RemoveField(
                    model_name='hold',
                    name='window',
                ),
                migrations.RemoveField(
                    model_name='reservation',
                    name='api_key',
                ),
                migrations.RemoveField(
                    model_name='reservation',
                    name='end_customer',
                ),
                migrations.RemoveField(
                    model_name='reservation',
                    name='member',
                ),
                migrations.RemoveField(
                    model_name='reservation',
                    name='organization',
                ),
                migrations.RemoveField(
                    model_name='reservation',
                    name='project',
                ),
                migrations.DeleteModel(
                    name='Budget',
                ),
                migrations.DeleteModel(
                    name='GatewayInstance',
                ),
                migrations.DeleteModel(
                    name='Hold',
                ),
                migrations.DeleteModel(
                    name='Window',
                ),
                migrations.DeleteModel(
                    name='Reservation',
                ),
            ],
            database_operations=[],
        ),
    ]
