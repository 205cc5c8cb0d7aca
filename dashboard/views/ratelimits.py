"""Rate limits: list, create, edit, delete (the edit and delete steps are dashboard/views/crud.py's).
Each POST calls one ratelimits service; its InvalidChange comes back as a form error and nothing
is changed."""

from __future__ import annotations

from typing import Any

from django import forms
from django.http import HttpRequest, HttpResponse, QueryDict

from dashboard.access import org_view, render_org
from dashboard.fields import api_field
from dashboard.forms import OrgForm
from dashboard.views.crud import Editor, Resource, delete_action, edit_page
from ratelimits import services
from ratelimits.api import RateLimitSerializer
from ratelimits.models import RateLimit
from tenants.models import ApiKey, EndCustomer, Project
from tenants.selectors import Access


class RateLimitForm(OrgForm):
    name = forms.CharField(max_length=200, required=False, help_text="what a refused caller reads")
    scope = api_field(RateLimitSerializer, "scope")
    project = forms.ModelChoiceField(queryset=Project.objects.none(), required=False)
    api_key = forms.ModelChoiceField(queryset=ApiKey.objects.none(), required=False, label="Key")
    end_customer = forms.ModelChoiceField(queryset=EndCustomer.objects.none(), required=False)
    requests_per_minute = api_field(RateLimitSerializer, "requests_per_minute", required=False)
    tokens_per_minute = api_field(
        RateLimitSerializer,
        "tokens_per_minute",
        required=False,
        help_text="input bound + output ceiling of each request",
    )

    SUBJECT = ("scope", "project", "api_key", "end_customer")

    def __init__(self, *args: Any, editing: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        org = self.organization
        self.model_choice("project").queryset = org.projects.order_by("name")
        self.model_choice("api_key").queryset = org.api_keys.order_by("name")
        self.model_choice("end_customer").queryset = EndCustomer.objects.filter(project__organization=org).order_by(
            "external_id"
        )
        if editing:  # scope and subject are fixed once created
            for name in self.SUBJECT:
                self.fields[name].disabled = True


@org_view()
def rate_limits(request: HttpRequest, access: Access) -> HttpResponse:
    rows = (
        RateLimit.objects.filter(organization=access.organization)
        .select_related("project", "api_key", "end_customer")
        .order_by("scope", "id")
    )
    return render_org(request, access, "dashboard/rate_limits.html", "rate_limits", limits=rows)


RATE_LIMITS = Resource(RateLimit, "Rate limit", "rate_limits", delete_url="dashboard:rate_limit_delete")


class RateLimitEditor(Editor):
    resource = RATE_LIMITS
    new_submit = "Create rate limit"
    created = "created"

    def form(self, data: QueryDict | None, access: Access, row: RateLimit | None, query: QueryDict) -> RateLimitForm:
        if row is None:
            return RateLimitForm(data, organization=access.organization)
        initial = {
            f: getattr(row, f) for f in ("name", *RateLimitForm.SUBJECT, "requests_per_minute", "tokens_per_minute")
        }
        return RateLimitForm(data, organization=access.organization, initial=initial, editing=True)

    def save(self, access: Access, row: RateLimit | None, form: RateLimitForm) -> RateLimit:
        if row is None:
            data = dict(form.cleaned_data)
            return services.create_rate_limit(
                organization=access.organization, actor=access.actor, scope=data.pop("scope"), **data
            )
        data = {k: v for k, v in form.cleaned_data.items() if k not in RateLimitForm.SUBJECT}
        services.update_rate_limit(limit=row, actor=access.actor, **data)
        return row


rate_limit_edit = edit_page(RateLimitEditor())
rate_limit_delete = delete_action(RATE_LIMITS, services.delete_rate_limit, instance="limit")
