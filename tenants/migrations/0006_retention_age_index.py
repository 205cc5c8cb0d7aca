from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built concurrently: the table grows with traffic, and a plain CREATE INDEX would block its
    # writes for the whole build. The index serves retention's deletes by age.
    atomic = False

    dependencies = [
        ('tenants', '0005_bind_api_tokens_to_members'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='auditlogentry',
            index=models.Index(fields=['created_at'], name='audit_log_created_idx'),
        ),
    ]
