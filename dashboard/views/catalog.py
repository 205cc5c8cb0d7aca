"""Routes (ordered targets and the default output ceiling) and list prices, edited in the
dashboard rather than only in `apply`. Each POST calls one catalog service; its InvalidChange
comes back as a form error and nothing is changed.

List prices are global (every organization prices with them), so only staff users edit them;
they reach the page through an organization they belong to, like every other page."""

from __future__ import annotations

from operator import attrgetter
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.forms.models import fields_for_model
from django.http import HttpRequest, QueryDict
from django.shortcuts import get_object_or_404

from catalog import services
from catalog.api import RouteSerializer
from catalog.fields import PriceSerializer
from catalog.models import Model, Route
from core.errors import InvalidChange
from dashboard.fields import api_field
from dashboard.forms import OrgForm
from dashboard.views.crud import Editor, Resource, delete_action, edit_page
from tenants.selectors import Access

MAX_TARGETS = 6


class RouteForm(OrgForm):
    """A route's name, its default output ceiling, and up to MAX_TARGETS (connection, model)
    rows, tried in row order; empty rows are skipped."""

    name = forms.CharField(max_length=200, help_text="the model name your app sends")
    default_max_output_tokens = api_field(
        RouteSerializer,
        "default_max_output_tokens",
        required=False,
        label="Default output ceiling",
        help_text="tokens sent upstream when a request names none (the tighter of this and the key's); "
        "empty: the model's maximum",
    )

    def __init__(self, *args: Any, editing: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        connections = self.organization.connections.order_by("name")
        models = Model.objects.select_related("provider").order_by("provider__slug", "name")
        for i in range(MAX_TARGETS):
            self.fields[f"connection_{i}"] = forms.ModelChoiceField(
                queryset=connections, required=False, label=f"Target {i + 1}: connection"
            )
            self.fields[f"model_{i}"] = forms.ModelChoiceField(
                queryset=models,
                required=False,
                label=f"Target {i + 1}: model",
                help_text="tried first" if i == 0 else "tried if the one above fails",
            )
        if editing:  # the name is the route's identity (set_route keys on it)
            self.fields["name"].disabled = True

    def clean(self) -> dict[str, Any]:
        data = cast(dict[str, Any], super().clean())
        targets = []
        for i in range(MAX_TARGETS):
            connection, model = data.get(f"connection_{i}"), data.get(f"model_{i}")
            if (connection is None) != (model is None):
                self.add_error(
                    f"model_{i}" if model is None else f"connection_{i}",
                    "Choose both a connection and a model, or neither.",
                )
            elif connection is not None:
                targets.append((connection, model))
        if not targets and not self.errors:
            raise forms.ValidationError("A route needs at least one target.")
        data["targets"] = targets
        return data

    @staticmethod
    def initial_for(route: Route) -> dict[str, Any]:
        initial: dict[str, Any] = {"name": route.name, "default_max_output_tokens": route.default_max_output_tokens}
        for i, t in enumerate(route.targets.order_by("position")[:MAX_TARGETS]):
            initial[f"connection_{i}"], initial[f"model_{i}"] = t.connection_id, t.model_id
        return initial


ROUTES = Resource(Route, "Route", "connections", delete_url="dashboard:route_delete", label=attrgetter("name"))


class RouteEditor(Editor):
    resource = ROUTES
    note = "Targets are tried in order: the next one only when the one before fails."

    def form(self, data: QueryDict | None, access: Access, row: Route | None, query: QueryDict) -> RouteForm:
        initial = RouteForm.initial_for(row) if row else None
        return RouteForm(data, organization=access.organization, editing=row is not None, initial=initial)

    def save(self, access: Access, row: Route | None, form: RouteForm) -> Route:
        d, org = form.cleaned_data, access.organization
        name = row.name if row else d["name"]
        if row is None and org.routes.filter(name=name).exists():
            raise InvalidChange(f"A route named {name!r} exists.", param="name")
        route, _changes = services.set_route(
            organization=org,
            name=name,
            targets=d["targets"],
            actor=access.actor,
            default_max_output_tokens=d["default_max_output_tokens"],
        )
        return route


route_edit = edit_page(RouteEditor())
route_delete = delete_action(ROUTES, services.delete_route, instance="route")


# --- list prices (staff) --------------------------------------------------------------------------


class PriceForm(forms.Form):
    """The catalog fields set_model_price takes, each the PriceSerializer field `apply` and the
    price file are checked with (the model's own digits and limits, so a multiplier the column
    cannot hold is a form error, not a database error). Labels and help come from the model."""

    def __init__(self, *args: Any, creating: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if creating:
            self.fields["model"] = forms.CharField(max_length=250, help_text="provider/model, e.g. openai/gpt-4o")
        shown = fields_for_model(Model, fields=services.MODEL_PRICE_FIELDS)
        for name in services.MODEL_PRICE_FIELDS:
            required = name == "per_request_usd"  # not null: 0 is free
            self.fields[name] = api_field(
                PriceSerializer, name, required=required, label=shown[name].label, help_text=shown[name].help_text
            )
        self.order_fields(["model", *services.MODEL_PRICE_FIELDS])


class PriceEditor(Editor):
    """List prices are the catalog's (no organization): staff only, whatever their role here."""

    resource = Resource(Model, "Price", "connections", org_field="")
    note = (
        "List prices apply to every organization without a negotiated rate. "
        "Rates are USD per 1M tokens; empty means unpriced (refused under a blocking cap)."
    )
    manage = False

    def check(self, request: HttpRequest, access: Access) -> None:
        if not getattr(request.user, "is_staff", False):
            raise PermissionDenied("List prices are global: only staff edit them.")

    def get_row(self, access: Access, pk: int) -> Model:
        return get_object_or_404(Model.objects.select_related("provider"), pk=pk)

    def form(self, data: QueryDict | None, access: Access, row: Model | None, query: QueryDict) -> PriceForm:
        initial = {f: getattr(row, f) for f in services.MODEL_PRICE_FIELDS} if row else {"per_request_usd": 0}
        return PriceForm(data, initial=initial, creating=row is None)

    def save(self, access: Access, row: Model | None, form: PriceForm) -> tuple[str, dict]:
        d = dict(form.cleaned_data)
        ref = str(row) if row else d.pop("model")
        provider, _, name = ref.partition("/")
        if row is None and Model.objects.filter(provider__slug=provider, name=name).exists():
            raise InvalidChange(f"Model {ref!r} is already in the catalog.", param="model")
        _saved, changes = services.set_model_price(ref=ref, create=row is None, **d)
        return ref, changes

    def saved(self, request: HttpRequest, access: Access, row: Model | None, result: Any) -> None:
        ref, changes = result
        n = len(changes)
        message = (
            f"Price of {ref} saved ({n} field{'s' if n != 1 else ''} changed)."
            if row
            else f"{ref} added to the catalog."
        )
        messages.success(request, message)

    def title(self, row: Model | None) -> str:
        return f"List price of {row}" if row else "New catalog model"


price_edit = edit_page(PriceEditor())
