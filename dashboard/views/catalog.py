"""Routes (ordered targets and the default output ceiling) and list prices, edited in the
dashboard rather than only in `apply`. Each POST calls one catalog service; its InvalidChange
comes back as a form error and nothing is changed.

List prices are global (every organization prices with them), so only staff users edit them;
they reach the page through an organization they belong to, like every other page."""

from __future__ import annotations

from typing import Any, cast

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.forms.models import fields_for_model
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from catalog import services
from catalog.api import RouteSerializer
from catalog.fields import PriceSerializer
from catalog.models import Model, Route
from core.errors import InvalidChange
from dashboard.access import org_view, render_org, require_manage
from dashboard.fields import api_field
from dashboard.forms import OrgForm, add_service_error
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


@org_view(manage=True)
def route_edit(request: HttpRequest, access: Access, pk: int | None = None) -> HttpResponse:
    require_manage(access)
    org = access.organization
    route = get_object_or_404(Route, pk=pk, organization=org) if pk else None
    form = RouteForm(
        request.POST or None,
        organization=org,
        editing=route is not None,
        initial=RouteForm.initial_for(route) if route else None,
    )
    if request.method == "POST" and form.is_valid():
        d = form.cleaned_data
        name = route.name if route else d["name"]
        try:
            if route is None and org.routes.filter(name=name).exists():
                raise InvalidChange(f"A route named {name!r} exists.", param="name")
            services.set_route(
                organization=org,
                name=name,
                targets=d["targets"],
                actor=access.actor,
                default_max_output_tokens=d["default_max_output_tokens"],
            )
        except InvalidChange as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Route “{name}” saved.")
            return redirect("dashboard:connections", org.slug)
    title = f"Edit route “{route.name}”" if route else "New route"
    return render_org(
        request,
        access,
        "dashboard/form.html",
        "connections",
        form=form,
        title=title,
        submit="Save",
        delete_url="dashboard:route_delete" if route else None,
        obj=route,
        note="Targets are tried in order: the next one only when the one before fails.",
    )


@require_POST
@org_view(manage=True)
def route_delete(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
    route = get_object_or_404(Route, pk=pk, organization=access.organization)
    services.delete_route(route=route, actor=access.actor)
    messages.success(request, f"Route “{route.name}” deleted.")
    return redirect("dashboard:connections", access.organization.slug)


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


def _staff(request: HttpRequest) -> None:
    if not getattr(request.user, "is_staff", False):
        raise PermissionDenied("List prices are global: only staff edit them.")


@org_view()
def price_edit(request: HttpRequest, access: Access, pk: int | None = None) -> HttpResponse:
    _staff(request)
    model = get_object_or_404(Model.objects.select_related("provider"), pk=pk) if pk else None
    initial = {f: getattr(model, f) for f in services.MODEL_PRICE_FIELDS} if model else {"per_request_usd": 0}
    form = PriceForm(request.POST or None, initial=initial, creating=model is None)
    if request.method == "POST" and form.is_valid():
        d = dict(form.cleaned_data)
        ref = str(model) if model else d.pop("model")
        try:
            if (
                model is None
                and Model.objects.filter(provider__slug=ref.partition("/")[0], name=ref.partition("/")[2]).exists()
            ):
                raise InvalidChange(f"Model {ref!r} is already in the catalog.", param="model")
            _saved, changes = services.set_model_price(ref=ref, create=model is None, **d)
        except InvalidChange as exc:
            add_service_error(form, exc)
        else:
            messages.success(
                request,
                f"Price of {ref} saved ({len(changes)} field{'s' if len(changes) != 1 else ''} changed)."
                if model
                else f"{ref} added to the catalog.",
            )
            return redirect("dashboard:connections", access.organization.slug)
    return render_org(
        request,
        access,
        "dashboard/form.html",
        "connections",
        form=form,
        submit="Save",
        title=f"List price of {model}" if model else "New catalog model",
        note="List prices apply to every organization without a negotiated rate. "
        "Rates are USD per 1M tokens; empty means unpriced (refused under a blocking cap).",
    )
