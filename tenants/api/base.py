"""The one base of every organization resource in the management API (/api/orgs/{org_slug}/…).

A resource declares its model, its serializer and the audited services its writes call; the base
holds what every resource shares:

1. auth: an organization API token or the dashboard's session (DRF settings), then
   `OrgPermission`: a member or token of the URL's organization, else 404; writes need `can_write`.
2. scoping: every queryset is the organization's own rows (`org_field`), so an outsider's ids
   are 404, never another tenant's row.
3. the audit on writes: create, update and delete call the resource's `Writes` services with the
   caller as actor; the services validate, write and audit, and views never save a model.
4. pagination: the one limit/offset style (core/pagination.py).
5. the error shape: `{"code", "detail", "errors"}` from tenants/api/auth.py, for every error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, cast

from django.db import models
from rest_framework import mixins, viewsets

from core.pagination import Pagination
from tenants.api.auth import OrgPermission, api_exception_handler
from tenants.models import ApiToken, Organization
from tenants.selectors import Access, access_for_token, access_for_user


@dataclass(frozen=True)
class Writes:
    """The audited services a resource's writes call, each keyword-only with `actor=`:
    `create(organization=, actor=, **validated)` returns the new row, `update(<instance>=row,
    actor=, **validated)` and `delete(<instance>=row, actor=)` change it; `instance` is the
    services' keyword for the row (budget=, connection=, ...)."""

    instance: str
    create: Callable[..., Any] | None = None
    update: Callable[..., Any] | None = None
    delete: Callable[..., Any] | None = None


class OrgViewSet(viewsets.GenericViewSet):
    """An organization's resource, read-only unless a subclass adds the write mixins (or uses
    `OrgCrudViewSet`). Subclasses set `model` (and `org_field` when the organization is not a
    direct field) or override `org_queryset` for a selector's rows."""

    permission_classes = [OrgPermission]
    pagination_class = Pagination
    lookup_value_regex = r"[0-9]+"

    model: ClassVar[type[models.Model]]
    org_field: ClassVar[str] = "organization"
    # A stable order, so limit/offset pages neither repeat nor skip rows.
    ordering: ClassVar[tuple[str, ...]] = ("id",)
    writes: ClassVar[Writes | None] = None

    def get_exception_handler(self) -> Callable[..., Any]:
        return api_exception_handler

    @cached_property
    def access(self) -> Access:
        slug = self.kwargs.get("org_slug", "")
        if isinstance(self.request.auth, ApiToken):
            return access_for_token(token=self.request.auth, slug=slug)
        return access_for_user(user=self.request.user, slug=slug)  # 404 for outsiders

    @property
    def organization(self) -> Organization:
        return self.access.organization

    def can_write(self, access: Access) -> bool:
        return access.can_manage

    def get_serializer_context(self) -> dict[str, Any]:
        # cast: DRF builds a fresh dict here; the stubs declare it a read-only Mapping.
        context = cast(dict[str, Any], super().get_serializer_context())
        if not self.schema_only and "org_slug" in self.kwargs:
            context["organization"] = self.organization
        return context

    @property
    def schema_only(self) -> bool:
        """drf-spectacular builds the schema with a fake view that has no organization."""
        return bool(getattr(self, "swagger_fake_view", False))

    def get_queryset(self):
        if self.schema_only:
            return self.model._default_manager.none()
        return self.org_queryset()

    def org_queryset(self) -> models.QuerySet:
        return self.model._default_manager.filter(**{self.org_field: self.organization}).order_by(*self.ordering)

    # --- writes: one audited service each ------------------------------------------------------

    def _service(self, name: str) -> Callable[..., Any]:
        service = getattr(self.writes, name, None)
        if service is None:  # a write mixin without its service is a wiring mistake, not input
            raise TypeError(f"{type(self).__name__}.writes has no {name} service")
        return cast(Callable[..., Any], service)

    def create_kwargs(self, data: dict[str, Any]) -> dict[str, Any]:
        """The create service's arguments besides `actor` (default: the organization and the data)."""
        return {"organization": self.organization, **data}

    def update_kwargs(self, instance: models.Model, data: dict[str, Any]) -> dict[str, Any]:
        return data

    def perform_create(self, serializer) -> None:
        create = self._service("create")
        serializer.instance = create(actor=self.access.actor, **self.create_kwargs(dict(serializer.validated_data)))

    def perform_update(self, serializer) -> None:
        row, data = serializer.instance, self.update_kwargs(serializer.instance, dict(serializer.validated_data))
        self._service("update")(**{self._instance_kw: row}, actor=self.access.actor, **data)

    def perform_destroy(self, instance) -> None:
        self._service("delete")(**{self._instance_kw: instance}, actor=self.access.actor)

    @property
    def _instance_kw(self) -> str:
        return self.writes.instance if self.writes else ""


class OrgReadViewSet(OrgViewSet, mixins.ListModelMixin, mixins.RetrieveModelMixin):
    """List and retrieve."""


class OrgCrudViewSet(
    OrgViewSet,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
):
    """List, retrieve, create, update and delete, each write through `writes`."""
