"""Configuration as code, the reading side: the errors `apply` reports, the changes it prints,
one item of the file (`_Item`), feeding an item through the API's serializer (`validated`), and
the lookups of the subjects items name. The walk itself is dashboard/services/apply_document.py.

Every item's fields are checked by the management API's own serializer (the API's rules and
messages, catalog/fields.py and tenants/api/fields.py), then its service checks the rest. A bad
item is recorded with its path (`organizations[0].budgets[2].amount_usd: ...`) and apply goes
on, so one run reports every error in the file; then nothing is changed.
"""

from __future__ import annotations

import builtins  # `builtins.str` in _Item: its own `str` method shadows the name there
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rest_framework import serializers

from core.errors import InvalidChange
from core.money import format_usd
from tenants.api.fields import flat_errors
from tenants.audit import APPLY
from tenants.models import ApiKey, EndCustomer, Member, Organization, Project

__all__ = ["APPLY", "ApplyError", "ApplyResult", "Change", "find_subjects", "validated"]

Problem = tuple[str, str]  # (path in the file, message)


class ApplyError(Exception):
    """One or more bad items of the file, each with its path; nothing was changed."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.problems: list[Problem] = [(path, message)]

    @classmethod
    def of(cls, problems: Iterable[Problem]) -> ApplyError:
        problems = list(problems)
        error = cls(*problems[0])
        error.problems = problems
        return error

    def __str__(self) -> str:
        return "\n".join(f"{path}: {message}" for path, message in self.problems)


@dataclass
class Change:
    action: str  # "create" | "update"
    kind: str
    label: str
    fields: dict[str, list[Any]] = field(default_factory=dict)

    def __str__(self) -> str:
        if self.action == "create":
            return f"+ {self.kind} {self.label}"
        parts = [f"{k}: {_show(a)} → {_show(b)}" for k, (a, b) in self.fields.items()]
        return f"~ {self.kind} {self.label}: " + ", ".join(parts)


@dataclass
class ApplyResult:
    changes: list[Change] = field(default_factory=list)
    secrets: list[tuple[str, str]] = field(default_factory=list)  # (key label, raw secret)
    dry_run: bool = False
    errors: list[Problem] = field(default_factory=list)  # every bad item's problems, in file order


def _show(value: Any) -> str:
    return "—" if value is None else str(value)


def _usd_fields(changes: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Show nano-USD fields as USD to the reader."""
    out = {}
    for k, (a, b) in changes.items():
        if k.endswith("_nano"):
            k = k[: -len("_nano")] + "_usd"
            a = None if a is None else format_usd(a, symbol=False)
            b = None if b is None else format_usd(b, symbol=False)
        out[k] = [a, b]
    return out


def _record(result: ApplyResult, kind: str, label: str, changes: dict[str, list[Any]]) -> None:
    if changes:
        result.changes.append(Change("update", kind, label, _usd_fields(changes)))


# --- reading the document ----------------------------------------------------------------------


class _Item:
    """One mapping of the document, with its path for error messages. Unknown and missing
    fields are kept as `problems`, reported with the item's other errors."""

    def __init__(self, data: Any, path: str, allowed: set[str], required: set[str] = frozenset()):  # type: ignore[assignment]
        if not isinstance(data, dict):
            raise ApplyError(path, "expected a mapping")
        self.data, self.path = data, path
        self.problems: list[Problem] = []
        unknown = set(data) - allowed
        if unknown:
            self.problems.append((path, f"unknown field(s) {', '.join(sorted(map(str, unknown)))}"))
        missing = required - set(data)
        if missing:
            self.problems.append((path, f"missing field(s) {', '.join(sorted(missing))}"))

    def has(self, key: str) -> bool:
        return key in self.data

    def str(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key, default)
        if value is not None and not isinstance(value, str):
            raise ApplyError(f"{self.path}.{key}", "expected text")
        return value

    def list(self, key: builtins.str) -> list[Any]:
        value = self.data.get(key) or []
        if not isinstance(value, list):
            raise ApplyError(f"{self.path}.{key}", "expected a list")
        return value


def validated(
    item: _Item,
    serializer_class: type[serializers.Serializer],
    data: dict[str, Any],
    *,
    organization: Organization | None = None,
    names: dict[str, str] | None = None,
    problems: Iterable[Problem] = (),
) -> dict[str, Any]:
    """`data` (an item's fields, in the API's names) checked by the API's serializer: its
    validated values, or an ApplyError with every problem of the item (its own `problems`, those
    given, the serializer's, each at its path in the file; `names` maps API names back)."""
    found = [*item.problems, *problems]
    # With problems found already (a subject that could not be found is left out of `data`), a
    # field left out is not also called missing.
    serializer = serializer_class(data=data, partial=bool(found), context={"organization": organization})
    if not serializer.is_valid():
        found += [
            (f"{item.path}.{path}" if path else item.path, message)
            for path, message in flat_errors(serializer.errors, names=names)
        ]
    if found:
        raise ApplyError.of(found)
    return dict(serializer.validated_data)


@contextmanager
def _guard(path: str) -> Iterator[None]:
    """Turn a service's InvalidChange into an ApplyError naming the item."""
    try:
        yield
    except InvalidChange as exc:
        raise ApplyError(f"{path}.{exc.param}" if exc.param else path, exc.message) from exc


def pk(obj: Any) -> Any:
    return None if obj is None else obj.pk


# --- the subjects items name (project by slug, member by email, key by name) ------------------


def _find_member(org: Organization, email: str | None, path: str) -> Member | None:
    if email is None:
        return None
    member = org.members.filter(user__email__iexact=email).first()
    if member is None:
        raise ApplyError(path, f"no member {email!r} in {org.slug} (declare it under members)")
    return member


def _find_project(org: Organization, slug: str | None, path: str) -> Project:
    project = org.projects.filter(slug=slug).first()
    if project is None:
        raise ApplyError(path, f"no project {slug!r} in {org.slug} (declare it under projects)")
    return project


def _unique(qs: Any, path: str, what: str) -> Any:
    found = list(qs[:2])
    if len(found) > 1:
        raise ApplyError(path, f"several {what} share this name; rename them so apply can tell them apart")
    return found[0] if found else None


def find_subjects(org: Organization, item: _Item) -> dict[str, Any]:
    """The subjects an item names (budgets, rate limits): project by slug, member by email, key
    by name, end customer as project/external_id; each must be declared in the organization."""
    subject: dict[str, Any] = {}
    if item.has("project"):
        subject["project"] = _find_project(org, item.str("project"), f"{item.path}.project")
    if item.has("member"):
        subject["member"] = _find_member(org, item.str("member"), f"{item.path}.member")
    if item.has("key"):
        key = _unique(ApiKey.objects.filter(organization=org, name=item.str("key")), item.path, "keys")
        if key is None:
            raise ApplyError(f"{item.path}.key", f"no key {item.str('key')!r} (declare it under keys)")
        subject["api_key"] = key
    if item.has("end_customer"):
        project_slug, _, external_id = (item.str("end_customer") or "").partition("/")
        customer = EndCustomer.objects.filter(
            project__organization=org, project__slug=project_slug, external_id=external_id
        ).first()
        if customer is None:
            raise ApplyError(f"{item.path}.end_customer", "write project/external_id of a declared end customer")
        subject["end_customer"] = customer
    return subject


def subjects_of(org: Organization, item: _Item) -> tuple[dict[str, Any], list[Problem]]:
    """find_subjects, a subject it cannot find kept as a problem so that the item's other
    errors are reported with it."""
    try:
        return find_subjects(org, item), []
    except ApplyError as exc:
        return {}, exc.problems
