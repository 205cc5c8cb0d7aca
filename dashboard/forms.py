"""Dashboard forms: parse and shape input. A field the API also takes is the API's own field
(dashboard/fields.py: same rules, same messages); the services check the rest and report field
errors (InvalidChange.param names the form field)."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from typing import Any, cast

from django import forms

from budgets.api import BudgetSerializer, OrganizationSerializer, ProjectSerializer
from budgets.services import SUBJECT_FIELD
from catalog.api import ConnectionSerializer
from core.errors import InvalidChange, NotAllowed
from dashboard.fields import api_field, comma_list, percentages, show_list
from tenants.api.views import KeySerializer
from tenants.models import ApiKey, ApiToken, EndCustomer, Member, Organization, Project


def add_service_error(form: forms.Form, exc: InvalidChange | NotAllowed) -> None:
    """Show a service's error next to its field (or on the form if it names none we show)."""
    field = exc.param if exc.param in form.fields else None
    form.add_error(field, exc.message)


class OrgForm(forms.Form):
    """A form whose choices are limited to one organization."""

    def __init__(self, *args: Any, organization: Organization, **kwargs: Any):
        self.organization = organization
        super().__init__(*args, **kwargs)

    def model_choice(self, name: str) -> forms.ModelChoiceField[Any]:
        """A ModelChoiceField by name (typed: `self.fields` holds plain `Field`s)."""
        return cast("forms.ModelChoiceField[Any]", self.fields[name])


class BudgetForm(OrgForm):
    name = forms.CharField(max_length=200, required=False)
    scope = api_field(BudgetSerializer, "scope")
    project = forms.ModelChoiceField(queryset=Project.objects.none(), required=False)
    member = forms.ModelChoiceField(queryset=Member.objects.none(), required=False)
    api_key = forms.ModelChoiceField(queryset=ApiKey.objects.none(), required=False, label="Key")
    end_customer = forms.ModelChoiceField(queryset=EndCustomer.objects.none(), required=False)
    run_id = forms.CharField(max_length=200, required=False, label="Run id")
    period = api_field(BudgetSerializer, "period", initial="month")
    timezone = forms.CharField(max_length=64, initial="UTC")
    mode = api_field(
        BudgetSerializer,
        "mode",
        initial="block",
        help_text="block refuses requests before the provider call; alert only notifies",
    )
    amount_usd = api_field(BudgetSerializer, "amount_usd", label="Amount (USD)")
    thresholds = api_field(
        BudgetSerializer,
        "thresholds",
        parse=percentages,
        show=show_list,
        required=False,
        initial="50, 80, 100",
        help_text="percent of the amount",
    )
    recipients = api_field(
        BudgetSerializer,
        "recipients",
        parse=comma_list,
        show=show_list,
        required=False,
        widget=forms.Textarea,
        help_text="emails, comma-separated; empty: the organization's owners",
    )

    SUBJECT = ("scope", "project", "member", "api_key", "end_customer", "run_id")
    # The page shows only the chosen scope's subject field (templates/dashboard/_scope_subjects.html).
    scope_subjects = {str(scope): field for scope, field in SUBJECT_FIELD.items()}

    def __init__(self, *args: Any, editing: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        org = self.organization
        self.model_choice("project").queryset = org.projects.order_by("name")
        self.model_choice("member").queryset = org.members.select_related("user").order_by("id")
        self.model_choice("api_key").queryset = org.api_keys.order_by("name")
        self.model_choice("end_customer").queryset = EndCustomer.objects.filter(project__organization=org).order_by(
            "external_id"
        )
        if editing:  # scope and subject are fixed once created
            for name in self.SUBJECT:
                self.fields[name].disabled = True

    def service_kwargs(self) -> dict[str, Any]:
        d = dict(self.cleaned_data)
        d["amount_nano"] = d.pop("amount_usd")  # the API's field: nano-USD
        if not d.get("thresholds"):
            d["thresholds"] = [50, 80, 100]
        d["run_id"] = d.get("run_id") or None
        return d


class KeyForm(OrgForm):
    name = forms.CharField(max_length=200)
    project = forms.ModelChoiceField(queryset=Project.objects.none())
    member = forms.ModelChoiceField(
        queryset=Member.objects.none(), required=False, help_text="whose key it is (spend can be capped per member)"
    )
    allowed_models = api_field(
        KeySerializer,
        "allowed_models",
        parse=comma_list,
        show=show_list,
        required=False,
        help_text="comma-separated; empty: every routed model",
    )
    expires_at = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}), help_text="UTC"
    )
    default_max_output_tokens = api_field(
        KeySerializer,
        "default_max_output_tokens",
        required=False,
        label="Default output ceiling",
        help_text="tokens sent upstream when a request names none; empty: the model's maximum",
    )

    def __init__(self, *args: Any, can_choose_member: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.model_choice("project").queryset = self.organization.projects.order_by("name")
        self.model_choice("member").queryset = self.organization.members.select_related("user").order_by("id")
        if not can_choose_member:
            del self.fields["member"]


class ProjectForm(OrgForm):
    slug = forms.SlugField(max_length=100)
    name = forms.CharField(max_length=200)
    default_customer_budget_usd = api_field(
        ProjectSerializer,
        "default_customer_budget_usd",
        required=False,
        label="Default end-customer cap (USD)",
        help_text="applies to each end customer without a budget of its own",
    )
    default_customer_budget_period = api_field(
        ProjectSerializer, "default_customer_budget_period", initial="month", label="Cap period"
    )
    default_customer_budget_mode = api_field(
        ProjectSerializer, "default_customer_budget_mode", initial="block", label="Cap mode"
    )

    def service_kwargs(self) -> dict[str, Any]:
        d = dict(self.cleaned_data)
        d["default_customer_budget_nano"] = d.pop("default_customer_budget_usd")  # the API's field: nano-USD
        return d


class EndCustomerForm(OrgForm):
    project = forms.ModelChoiceField(queryset=Project.objects.none())
    external_id = forms.CharField(
        max_length=200, label="External id", help_text="the value your app sends as X-Capgate-Customer"
    )

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.model_choice("project").queryset = self.organization.projects.order_by("name")


class InviteForm(forms.Form):
    email = forms.EmailField()
    role = forms.ChoiceField(choices=Member.Role.choices, initial="member")


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Member.Role.choices)


RATE_FIELDS = ("input_usd_per_mtok", "output_usd_per_mtok", "cache_read_usd_per_mtok", "cache_write_usd_per_mtok")


def rate_field(name: str, label: str) -> forms.Field:
    return api_field(
        ConnectionSerializer,
        name,
        required=False,
        label=label,
        help_text="USD per 1M tokens; empty: the catalog's list price",
    )


class ConnectionForm(forms.Form):
    name = forms.CharField(max_length=100)
    kind = api_field(ConnectionSerializer, "kind")
    base_url = forms.URLField(required=False, max_length=200, assume_scheme="https")
    secret = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        strip=False,
        help_text="write-only: stored encrypted, never shown; leave empty to keep",
    )
    input_usd_per_mtok = rate_field("input_usd_per_mtok", "Negotiated input rate")
    output_usd_per_mtok = rate_field("output_usd_per_mtok", "Negotiated output rate")
    cache_read_usd_per_mtok = rate_field("cache_read_usd_per_mtok", "Negotiated cache-read rate")
    cache_write_usd_per_mtok = rate_field("cache_write_usd_per_mtok", "Negotiated cache-write rate")
    options = forms.JSONField(required=False, initial=dict, help_text='e.g. {"delay_ms": 20} for echo')
    enabled = forms.BooleanField(required=False, initial=True)

    def clean_options(self) -> dict:
        value = self.cleaned_data.get("options") or {}
        if not isinstance(value, dict):
            raise forms.ValidationError("A JSON object.")
        return value


class PolicyForm(forms.Form):
    allow_unpriced = forms.BooleanField(
        required=False,
        label="Allow models with no price",
        help_text="blocking budgets then do not govern that traffic (it cannot be bounded)",
    )
    default_run_budget_usd = api_field(
        OrganizationSerializer,
        "default_run_budget_usd",
        required=False,
        label="Default run budget (USD)",
        help_text="for X-Capgate-Run without X-Capgate-Run-Budget-Usd",
    )


class TokenForm(forms.Form):
    name = forms.CharField(max_length=200)
    scope = forms.ChoiceField(choices=ApiToken.Scope.choices, initial="read")


class UsageFilterForm(OrgForm):
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), help_text="inclusive")
    project = forms.ModelChoiceField(queryset=Project.objects.none(), required=False)
    api_key = forms.ModelChoiceField(queryset=ApiKey.objects.none(), required=False, label="Key")
    model = forms.CharField(required=False, max_length=200)
    end_customer = forms.CharField(required=False, max_length=200, label="End customer id")
    status = forms.ChoiceField(
        required=False, choices=[("", "any")] + [(s, s) for s in ("served", "failed_upstream", "estimated", "released")]
    )

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.model_choice("project").queryset = self.organization.projects.order_by("name")
        self.model_choice("api_key").queryset = self.organization.api_keys.order_by("name")


class ChartForm(forms.Form):
    """The charts page's range (a preset ending now, or whole UTC days) and grouping."""

    RANGES = {"day": timedelta(hours=24), "week": timedelta(days=7), "month": timedelta(days=30)}
    MAX_DAYS = 366  # a custom range is drawn in days: a year is 366 bars at most

    range = forms.ChoiceField(
        required=False,
        choices=[("day", "last 24 hours"), ("week", "last 7 days"), ("month", "last 30 days"), ("custom", "custom")],
    )
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), help_text="custom, UTC")
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}), help_text="inclusive")
    by = forms.ChoiceField(
        required=False,
        label="Group by",
        choices=[("project", "project"), ("key", "key"), ("model", "model"), ("customer", "customer")],
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        data["range"] = data.get("range") or "week"
        data["by"] = data.get("by") or "project"
        if data["range"] == "custom":
            start, end = data.get("start"), data.get("end")
            if start is None or end is None:
                raise forms.ValidationError("A custom range needs a start and an end date.")
            if end < start:
                self.add_error("end", "The end is before the start.")
            elif (end - start).days + 1 > self.MAX_DAYS:
                self.add_error("end", f"At most {self.MAX_DAYS} days.")
        return data

    def drawn(self, buckets: list[datetime]) -> ChartForm:
        """The picker for a drawn range: the range and grouping resolved (defaults included) and
        the first and last day drawn as its dates, so what it shows is what the charts show
        (not the first option of an unset choice, nor dates a preset range ignored)."""
        d = self.cleaned_data
        return ChartForm({"range": d["range"], "by": d["by"], "start": buckets[0].date(), "end": buckets[-1].date()})

    def window(self, now: datetime) -> tuple[datetime, str, list[datetime]]:
        """(since, bucket, bucket starts) of a valid form: the last 24 hours by hour, 7 or 30
        days by day (today included), or the custom days (by hour when it is a single day)."""
        d = self.cleaned_data
        if d["range"] == "day":
            until = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
            return until - self.RANGES["day"], "hour", [until - timedelta(hours=24 - i) for i in range(24)]
        if d["range"] == "custom":
            since = datetime.combine(d["start"], time.min, tzinfo=UTC)
            days = (d["end"] - d["start"]).days + 1
        else:
            days = self.RANGES[d["range"]].days
            since = datetime.combine(now.astimezone(UTC).date(), time.min, tzinfo=UTC) - timedelta(days=days - 1)
        if days == 1:
            return since, "hour", [since + timedelta(hours=i) for i in range(24)]
        return since, "day", [since + timedelta(days=i) for i in range(days)]
