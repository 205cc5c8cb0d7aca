"""Bind every API token to the membership of the user who created it (tokens now act with their
member's current role). A live token whose creator is unknown (deleted user) or no longer a
member of the token's organization answers to no one: it is revoked here, with an audit entry
per token (docs/decisions.md, "API tokens belong to a member")."""

import django.db.models.deletion
from django.db import migrations, models
from django.utils import timezone


def bind_tokens(apps, schema_editor):
    ApiToken = apps.get_model("tenants", "ApiToken")
    Member = apps.get_model("tenants", "Member")
    AuditLogEntry = apps.get_model("tenants", "AuditLogEntry")
    now = timezone.now()
    for token in ApiToken.objects.select_for_update().order_by("id"):
        member = (
            Member.objects.filter(organization_id=token.organization_id, user_id=token.created_by_id).first()
            if token.created_by_id is not None
            else None
        )
        if member is not None:
            token.member = member
            token.save(update_fields=["member"])
        elif token.revoked_at is None:
            token.revoked_at = now
            token.save(update_fields=["revoked_at"])
            AuditLogEntry.objects.create(
                organization_id=token.organization_id,
                actor="migration: token has no member to act for",
                action="update",
                object_type="apitoken",
                object_id=str(token.pk),
                object_repr=f"{token.name} ({token.prefix}…, {token.scope})"[:300],
                changes={"revoked_at": [None, now.isoformat()]},
            )


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_audit_without_organization"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="member",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="api_tokens",
                to="tenants.member",
            ),
        ),
        # Reversing keeps what it revoked revoked: a revoked token is never brought back.
        migrations.RunPython(bind_tokens, migrations.RunPython.noop),
    ]
