from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import pre_delete


class TenantsConfig(AppConfig):
    """Who owns what. ready() connects the one hook tenants keeps on the user model: deleting a
    user (the admin site, a shell) deletes their memberships without `remove_member`, so their
    gateway keys and API tokens are revoked, audited, inside that deletion."""

    name = "tenants"

    def ready(self) -> None:
        pre_delete.connect(_user_deleting, sender=settings.AUTH_USER_MODEL, dispatch_uid="tenants.user_deleting")


def _user_deleting(sender: Any, instance: Any, **kwargs: Any) -> None:
    # Imported here: the app registry is not ready when this module loads.
    from tenants.audit import Actor
    from tenants.members import revoke_user_access

    revoke_user_access(user=instance, actor=Actor(label=f"user {instance.get_username()} deleted"))
