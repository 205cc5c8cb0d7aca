"""Field rules of the management API that know nothing of money or the catalog, written once
(the money and price rules build on them in catalog/fields.py).

Each rule is a DRF serializer field: the API's serializers declare their fields with these, the
dashboard forms wrap the same fields (dashboard/fields.py), and `manage.py apply` feeds every
item of its file through the API's serializers. So a value is accepted or refused, with the same
message, whichever way it arrives (docs/decisions.md, 2026-12-01).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from rest_framework import serializers

from core.strict import ascii_int
from tenants.services import MAX_OUTPUT_CEILING

# One wording for "not a number", whichever field and path (DRF's and Django's differ).
NUMBER_MESSAGES: dict[str, Any] = {"invalid": "Enter a number."}
WHOLE_NUMBER_MESSAGES: dict[str, Any] = {"invalid": "Enter a whole number."}
# A PositiveIntegerField column's largest value.
MAX_INT = 2_147_483_647


def range_messages(message: str) -> dict[str, Any]:
    """One message for a whole number that is not one, too small or too large."""
    return {"invalid": message, "min_value": message, "max_value": message}


def choice_messages(label: str, choices: Any, *, nullable: bool = False) -> dict[str, Any]:
    """`Period must be one of hour, day, week, month.`: the services' wording, for the fields."""
    values = ", ".join(str(value) for value, _ in choices)
    return {"invalid_choice": f"{label} must be one of {values}{' or null' if nullable else ''}."}


def choice_field(label: str, choices: Any, *, nullable: bool = False, **kwargs: Any) -> serializers.ChoiceField:
    return serializers.ChoiceField(
        choices=choices,
        allow_null=nullable,
        error_messages=choice_messages(label, choices, nullable=nullable),
        **kwargs,
    )


class WholeNumberField(serializers.IntegerField):
    """An integer; `1.5`, `"ten"` and a bool are not (DRF would read `true` as 1), nor text other
    than ASCII digits (with a minus sign in front): DRF's int() also reads "1_000" and "١"."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("error_messages", WHOLE_NUMBER_MESSAGES)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or (isinstance(data, float) and not data.is_integer()):
            self.fail("invalid")
        if isinstance(data, str) and ascii_int(data.strip().removeprefix("-")) is None:
            self.fail("invalid")
        return super().to_internal_value(data)


class EmailAddressField(serializers.EmailField):
    """An email address; a bad one is named in the message (as the services word it), which
    matters in a list of recipients."""

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        try:
            validate_email(value)
        except ValidationError:
            raise serializers.ValidationError(f"{value!r} is not an email address.") from None
        return value


def output_ceiling_field(**kwargs: Any) -> WholeNumberField:
    """The output ceiling sent upstream when a request names none (a key's, a route's)."""
    kwargs.setdefault("required", False)
    kwargs.setdefault("allow_null", True)
    message = f"A whole number of tokens from 1 to {MAX_OUTPUT_CEILING:,}, or empty."  # the service's
    return WholeNumberField(min_value=1, max_value=MAX_OUTPUT_CEILING, error_messages=range_messages(message), **kwargs)


def flat_errors(detail: Any, path: str = "", names: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """A serializer's nested errors as (path, message) pairs: `thresholds[0]`, `targets[1].model`.
    `names` renames top-level fields (the API's `api_key` is a file's `key`)."""
    names = names or {}
    out: list[tuple[str, str]] = []
    if isinstance(detail, dict):
        for key, value in detail.items():
            if key == "non_field_errors":
                out += flat_errors(value, path)
            elif isinstance(key, int):
                out += flat_errors(value, f"{path}[{key}]")
            else:
                name = str(names.get(key, key))  # "": the field is the item itself
                out += flat_errors(value, ".".join(part for part in (path, name) if part))
    elif isinstance(detail, list):
        for i, value in enumerate(detail):
            if isinstance(value, dict | list):
                out += flat_errors(value, f"{path}[{i}]")
            else:
                out.append((path, str(value)))
    else:
        out.append((path, str(detail)))
    return out
