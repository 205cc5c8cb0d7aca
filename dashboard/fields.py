"""Form fields that validate with the management API's own fields: the same rules and the same
messages as the API and `manage.py apply` (docs/decisions.md, 2026-12-01, "One validation
path"). A form field only turns the submitted text into what the API field reads (a comma list
into a list); the API field decides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from rest_framework import serializers

from catalog.fields import UsdField
from tenants.api.fields import flat_errors


def _widget(api_field: serializers.Field, required: bool) -> forms.Widget:
    if isinstance(api_field, serializers.ChoiceField):
        blank = [] if required else [("", "---------")]  # empty: null
        return forms.Select(choices=[*blank, *api_field.choices.items()])
    if isinstance(api_field, serializers.DecimalField | serializers.IntegerField):
        return forms.NumberInput(attrs={"step": "any"})
    return forms.TextInput()


class ApiField(forms.Field):
    """A form field validated by `api_field` (a serializer's field, e.g.
    `BudgetSerializer().fields["amount_usd"]`). Empty is None, or [] for a list (or "required")."""

    def __init__(
        self,
        api_field: serializers.Field,
        *,
        parse: Callable[[str], Any] | None = None,
        show: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ):
        self.api_field, self.parse, self.show = api_field, parse, show
        kwargs.setdefault("widget", _widget(api_field, kwargs.get("required", True)))
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> Any:
        if value in self.empty_values:
            return [] if isinstance(self.api_field, serializers.ListField) else None
        if self.parse is not None:
            value = self.parse(value)
        try:
            return self.api_field.run_validation(value)
        except serializers.ValidationError as exc:
            messages = list(dict.fromkeys(message for _, message in flat_errors(exc.detail)))
            raise forms.ValidationError(messages) from exc

    def prepare_value(self, value: Any) -> Any:
        return self.show(value) if self.show is not None and value is not None else value


def api_field(serializer_class: type[serializers.Serializer], name: str, **kwargs: Any) -> ApiField:
    """The form field for `serializer_class`'s field `name`."""
    return ApiField(serializer_class().fields[name], **kwargs)


def usd_form_field(**kwargs: Any) -> ApiField:
    """A USD amount: the API's UsdField (cleaned to nano-USD)."""
    return ApiField(UsdField(allow_null=True, required=False), **kwargs)


def comma_list(text: Any) -> list[str]:
    """ "a, b" or one per line -> ["a", "b"]."""
    parts = str(text).replace("\n", ",").split(",")
    return [part.strip() for part in parts if part.strip()]


def percentages(text: Any) -> list[str]:
    """ "50, 80%, 100" -> ["50", "80", "100"]: a trailing % is a percentage."""
    return [part.removesuffix("%").strip() for part in comma_list(text)]


def show_list(value: Any) -> Any:
    return ", ".join(str(v) for v in value) if isinstance(value, list) else value
