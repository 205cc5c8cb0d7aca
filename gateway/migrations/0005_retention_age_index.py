from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built concurrently: the table grows with traffic, and a plain CREATE INDEX would block its
    # writes for the whole build. The index serves retention's deletes by age.
    atomic = False

    dependencies = [
        ('catalog', '0011_model_fast_mode_multiplier'),
        ('gateway', '0004_conversation_turn'),
        ('tenants', '0006_retention_age_index'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='storedresponse',
            index=models.Index(fields=['created_at'], name='stored_response_created_idx'),
        ),
    ]
