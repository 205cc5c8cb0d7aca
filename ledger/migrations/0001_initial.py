"""The ledger's rows, moved here in state only: the tables (budgets_budget, budgets_window,
budgets_reservation, budgets_hold, budgets_gatewayinstance, usage_usagerecord) were created by the
budgets and usage apps' migrations, which run first, and keep their names (db_table), so no SQL.
"""

import django.contrib.postgres.fields
import django.db.models.deletion
import django.db.models.functions.datetime
import django.utils.timezone
import ledger.models
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('budgets', '0008_window_blocking'),
        ('catalog', '0009_gemini_connection_kind'),
        ('tenants', '0004_audit_without_organization'),
        ('usage', '0008_usagerecord_conflicting_cost'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='GatewayInstance',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=200)),
                        ('started_at', models.DateTimeField(auto_now_add=True)),
                        ('heartbeat_at', models.DateTimeField()),
                        ('stopped_at', models.DateTimeField(blank=True, null=True)),
                    ],
                    options={
                        'db_table': 'budgets_gatewayinstance',
                    },
                ),
                migrations.CreateModel(
                    name='Budget',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(blank=True, max_length=200)),
                        ('scope', models.CharField(choices=[('organization', 'Organization'), ('project', 'Project'), ('member', 'Member'), ('key', 'Key'), ('end_customer', 'End Customer'), ('run', 'Run')], max_length=20)),
                        ('run_id', models.CharField(blank=True, max_length=200, null=True)),
                        ('period', models.CharField(choices=[('day', 'Day'), ('week', 'Week'), ('month', 'Month'), ('lifetime', 'Lifetime')], default='month', max_length=10)),
                        ('timezone', models.CharField(default='UTC', max_length=64)),
                        ('mode', models.CharField(choices=[('alert', 'Alert'), ('block', 'Block')], default='block', max_length=10)),
                        ('amount_nano', models.BigIntegerField()),
                        ('thresholds', models.JSONField(blank=True, default=ledger.models.default_thresholds)),
                        ('recipients', models.JSONField(blank=True, default=list)),
                        ('version', models.PositiveIntegerField(db_default=1, default=1)),
                        ('version_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), default=django.utils.timezone.now)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('api_key', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='budgets', to='tenants.apikey')),
                        ('end_customer', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='budgets', to='tenants.endcustomer')),
                        ('member', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='budgets', to='tenants.member')),
                        ('organization', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='budgets', to='tenants.organization')),
                        ('project', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='budgets', to='tenants.project')),
                    ],
                    options={
                        'db_table': 'budgets_budget',
                    },
                ),
                migrations.CreateModel(
                    name='Reservation',
                    fields=[
                        ('run_id', models.CharField(blank=True, max_length=200, null=True)),
                        ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                        ('request_id', models.CharField(max_length=100, unique=True)),
                        ('model', models.CharField(blank=True, max_length=200)),
                        ('amount_nano', models.BigIntegerField()),
                        ('created_at', models.DateTimeField()),
                        ('expires_at', models.DateTimeField()),
                        ('deadline_at', models.DateTimeField()),
                        ('job_id', models.CharField(blank=True, max_length=200, null=True)),
                        ('origin', models.CharField(choices=[('gateway', 'Gateway'), ('api', 'Api'), ('slice', 'Slice')], db_default='gateway', default='gateway', max_length=10)),
                        ('api_key', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenants.apikey')),
                        ('end_customer', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenants.endcustomer')),
                        ('member', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenants.member')),
                        ('organization', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenants.organization')),
                        ('owner', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='reservations', to='ledger.gatewayinstance')),
                        ('project', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenants.project')),
                    ],
                    options={
                        'db_table': 'budgets_reservation',
                    },
                ),
                migrations.CreateModel(
                    name='UsageRecord',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('run_id', models.CharField(blank=True, max_length=200, null=True)),
                        ('request_id', models.CharField(max_length=100, unique=True)),
                        ('subject', models.JSONField(blank=True, default=dict)),
                        ('reservation_id', models.UUIDField(blank=True, null=True)),
                        ('model', models.CharField(blank=True, max_length=200)),
                        ('provider_model', models.CharField(blank=True, max_length=200)),
                        ('status', models.CharField(choices=[('served', 'Served'), ('failed_upstream', 'Failed Upstream'), ('estimated', 'Estimated'), ('released', 'Released')], max_length=20)),
                        ('input_tokens', models.BigIntegerField(default=0)),
                        ('output_tokens', models.BigIntegerField(default=0)),
                        ('cache_read_tokens', models.BigIntegerField(default=0)),
                        ('cache_write_tokens', models.BigIntegerField(default=0)),
                        ('cost_nano', models.BigIntegerField(default=0)),
                        ('reserved_nano', models.BigIntegerField(default=0)),
                        ('excess_nano', models.BigIntegerField(default=0)),
                        ('reported_cost_nano', models.BigIntegerField(blank=True, null=True)),
                        ('conflicting_cost_nano', models.BigIntegerField(blank=True, null=True)),
                        ('error', models.TextField(blank=True)),
                        ('latency_ms', models.PositiveIntegerField(blank=True, null=True)),
                        ('input_bound', models.CharField(blank=True, default='', max_length=5)),
                        ('job_id', models.CharField(blank=True, max_length=200, null=True)),
                        ('admitted_at', models.DateTimeField()),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('applied', models.BooleanField(default=False)),
                        ('applied_at', models.DateTimeField(blank=True, null=True)),
                        ('window_ids', django.contrib.postgres.fields.ArrayField(base_field=models.BigIntegerField(), blank=True, default=list, size=None)),
                        ('api_key', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenants.apikey')),
                        ('connection', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='catalog.connection')),
                        ('end_customer', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenants.endcustomer')),
                        ('member', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenants.member')),
                        ('organization', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='tenants.organization')),
                        ('project', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenants.project')),
                    ],
                    options={
                        'db_table': 'usage_usagerecord',
                    },
                ),
                migrations.CreateModel(
                    name='Window',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('period_start', models.DateTimeField()),
                        ('period_end', models.DateTimeField(blank=True, null=True)),
                        ('spent_nano', models.BigIntegerField(default=0)),
                        ('reserved_nano', models.BigIntegerField(default=0)),
                        ('seed_spent_nano', models.BigIntegerField(default=0)),
                        ('seed_reserved_nano', models.BigIntegerField(db_default=0, default=0)),
                        ('blocking', models.BooleanField(db_default=True, default=True)),
                        ('budget_version', models.PositiveIntegerField(db_default=1, default=1)),
                        ('retired_at', models.DateTimeField(blank=True, null=True)),
                        ('touched_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), default=django.utils.timezone.now)),
                        ('budget', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='windows', to='ledger.budget')),
                    ],
                    options={
                        'db_table': 'budgets_window',
                    },
                ),
                migrations.CreateModel(
                    name='Hold',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('amount_nano', models.BigIntegerField()),
                        ('reservation', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='holds', to='ledger.reservation')),
                        ('window', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='holds', to='ledger.window')),
                    ],
                    options={
                        'db_table': 'budgets_hold',
                    },
                ),
                migrations.AddIndex(
                    model_name='budget',
                    index=models.Index(fields=['organization', 'scope'], name='budgets_bud_organiz_799ddb_idx'),
                ),
                migrations.AddConstraint(
                    model_name='budget',
                    constraint=models.CheckConstraint(condition=models.Q(('amount_nano__gte', 0)), name='budget_amount_nonnegative'),
                ),
                migrations.AddConstraint(
                    model_name='budget',
                    constraint=models.CheckConstraint(condition=models.Q(('scope', 'organization'), models.Q(('project__isnull', False), ('scope', 'project')), models.Q(('member__isnull', False), ('scope', 'member')), models.Q(('api_key__isnull', False), ('scope', 'key')), models.Q(('end_customer__isnull', False), ('scope', 'end_customer')), models.Q(('run_id__isnull', False), ('scope', 'run')), _connector='OR'), name='budget_scope_names_its_subject'),
                ),
                migrations.AddConstraint(
                    model_name='budget',
                    constraint=models.UniqueConstraint(condition=models.Q(('scope', 'run')), fields=('organization', 'run_id'), name='budget_one_per_run'),
                ),
                migrations.AddIndex(
                    model_name='reservation',
                    index=models.Index(fields=['expires_at'], name='budgets_res_expires_6aef18_idx'),
                ),
                migrations.AddIndex(
                    model_name='reservation',
                    index=models.Index(fields=['owner'], name='budgets_res_owner_i_5d93c5_idx'),
                ),
                migrations.AddConstraint(
                    model_name='reservation',
                    constraint=models.CheckConstraint(condition=models.Q(('amount_nano__gte', 0)), name='reservation_amount_nonnegative'),
                ),
                migrations.AddIndex(
                    model_name='usagerecord',
                    index=models.Index(condition=models.Q(('applied', False)), fields=['id'], name='usage_outbox_idx'),
                ),
                migrations.AddIndex(
                    model_name='usagerecord',
                    index=models.Index(fields=['organization', 'admitted_at'], name='usage_usage_organiz_52a165_idx'),
                ),
                migrations.AddIndex(
                    model_name='usagerecord',
                    index=models.Index(fields=['end_customer', 'admitted_at'], name='usage_usage_end_cus_93fb8a_idx'),
                ),
                migrations.AddIndex(
                    model_name='usagerecord',
                    index=models.Index(fields=['api_key', 'admitted_at'], name='usage_usage_api_key_f3a349_idx'),
                ),
                migrations.AddIndex(
                    model_name='usagerecord',
                    index=models.Index(condition=models.Q(('reported_cost_nano__isnull', False), models.Q(('reported_cost_nano', models.F('cost_nano')), _negated=True)), fields=['id'], name='usage_report_mismatch_idx'),
                ),
                migrations.AddConstraint(
                    model_name='usagerecord',
                    constraint=models.CheckConstraint(condition=models.Q(('cost_nano__gte', 0)), name='usage_cost_nonnegative'),
                ),
                migrations.AddConstraint(
                    model_name='usagerecord',
                    constraint=models.CheckConstraint(condition=models.Q(('reserved_nano__gte', 0)), name='usage_reserved_nonnegative'),
                ),
                migrations.AddConstraint(
                    model_name='usagerecord',
                    constraint=models.CheckConstraint(condition=models.Q(('excess_nano__gte', 0)), name='usage_excess_nonnegative'),
                ),
                migrations.AddConstraint(
                    model_name='window',
                    constraint=models.UniqueConstraint(fields=('budget', 'budget_version', 'period_start'), name='window_unique_per_period'),
                ),
                migrations.AddConstraint(
                    model_name='window',
                    constraint=models.CheckConstraint(condition=models.Q(('spent_nano__gte', 0)), name='window_spent_nonnegative'),
                ),
                migrations.AddConstraint(
                    model_name='window',
                    constraint=models.CheckConstraint(condition=models.Q(('reserved_nano__gte', 0)), name='window_reserved_nonnegative'),
                ),
                migrations.AddConstraint(
                    model_name='hold',
                    constraint=models.UniqueConstraint(fields=('reservation', 'window'), name='hold_unique_per_window'),
                ),
                migrations.AddConstraint(
                    model_name='hold',
                    constraint=models.CheckConstraint(condition=models.Q(('amount_nano__gte', 0)), name='hold_amount_nonnegative'),
                ),
            ],
            database_operations=[],
        ),
    ]
