"""References to an organization's objects in API bodies: the numeric id, or the name users
know it by (a project's slug, a key's or connection's name, an end customer's external id).

A reference never resolves outside the caller's organization: every lookup runs on the field's
organization-filtered queryset, so another organization's slug reads as "no such", exactly as
its id does.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model, QuerySet
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import build_basic_type
from drf_spectacular.types import OpenApiTypes
from rest_framework import serializers

# How many candidates an "ambiguous" error lists; more would not help anyone choose.
AMBIGUOUS_SHOWN = 5


def is_id(value: Any) -> bool:
    """A JSON integer, or a string of ASCII digits (form bodies send ids as strings). Such a
    value is always read as an id, so a key named "2024" is referenced by its id."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and value.isascii() and value.isdigit())


class OrgRelatedField(serializers.PrimaryKeyRelatedField):
    """A reference that only resolves inside the caller's organization: the object's id or,
    with `by`, the value of that field (unique in the organization, or the caller gets a 400
    asking for the id)."""

    default_error_messages = {
        "no_such": 'No {what} "{value}" in this organization.',
        "ambiguous": '{count} {what}s are named "{value}" (ids {ids}): use the id.',
        "incorrect_type": "Incorrect type. Expected an id or a {label}, received {data_type}.",
    }

    def __init__(self, *, org_path: str, by: str | None = None, by_label: str | None = None, **kwargs):
        self.org_path = org_path
        self.by = by
        self.by_label = by_label or (by or "").replace("_", " ")
        if by and "help_text" not in kwargs:
            kwargs["help_text"] = f"The id (an integer) or the {self.by_label}."
        super().__init__(**kwargs)

    def get_queryset(self):
        org = self.context.get("organization")
        qs = super().get_queryset()
        return qs.filter(**{self.org_path: org}) if org is not None else qs.none()

    @property
    def what(self) -> str:
        queryset = self.get_queryset()
        return str(queryset.model._meta.verbose_name)

    def to_internal_value(self, data):
        if self.by is None or is_id(data):
            if isinstance(data, bool):
                self.fail("incorrect_type", data_type="bool", label=self.by_label or "id")
            return super().to_internal_value(data)
        if not isinstance(data, str) or not data or len(data) > 200:
            self.fail("incorrect_type", data_type=type(data).__name__, label=self.by_label)
        if "\x00" in data:  # no name holds one, and PostgreSQL refuses it in a query
            self.fail("no_such", what=self.what, value=data.replace("\x00", "\\x00"))
        return self.resolve(self.get_queryset(), data)

    def resolve(self, queryset: QuerySet, value: str) -> Model:
        assert self.by is not None  # only called for fields with a name to look up
        return self.one(queryset.filter(**{self.by: value}), value)

    def one(self, queryset: QuerySet, value: str) -> Model:
        found = list(queryset.order_by("pk")[: AMBIGUOUS_SHOWN + 1])
        if not found:
            self.fail("no_such", what=self.what, value=value)
        if len(found) > 1:
            count = queryset.count() if len(found) > AMBIGUOUS_SHOWN else len(found)
            ids = ", ".join(str(o.pk) for o in found[:AMBIGUOUS_SHOWN]) + (", …" if count > AMBIGUOUS_SHOWN else "")
            self.fail("ambiguous", count=count, what=self.what, value=value, ids=ids)
        return found[0]


class EndCustomerRefField(OrgRelatedField):
    """An end customer by id or external id. External ids are unique per project, so the same
    one in two projects is ambiguous: `<project slug>/<external id>` picks the project."""

    def __init__(self, **kwargs):
        kwargs.setdefault("org_path", "project__organization")
        kwargs.setdefault("by", "external_id")
        kwargs.setdefault(
            "help_text",
            "The id (an integer), the external id, or `<project slug>/<external id>` "
            "when that external id is used in several projects.",
        )
        super().__init__(**kwargs)

    def resolve(self, queryset: QuerySet, value: str) -> Model:
        exact = queryset.filter(external_id=value)
        project_slug, slash, external_id = value.partition("/")
        if slash and not exact.exists():
            return self.one(queryset.filter(project__slug=project_slug, external_id=external_id), value)
        return self.one(exact, value)


class OrgRelatedFieldSchema(OpenApiSerializerFieldExtension):
    """Requests take an id or a name; responses always carry the id."""

    target_class = OrgRelatedField
    match_subclasses = True

    def map_serializer_field(self, auto_schema, direction):
        integer = build_basic_type(OpenApiTypes.INT)
        if direction == "response" or not self.target.by:
            return integer
        return {"oneOf": [integer, {"type": "string", "minLength": 1, "maxLength": 200}]}
