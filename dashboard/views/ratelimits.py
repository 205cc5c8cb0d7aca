"""Rate limits: list, create, edit, delete. Each POST calls one ratelimits service; its
InvalidChange comes back as a form error and nothing is changed."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from core.errors import InvalidChange
from dashboard.access import org_view, render_org, require_manage
from dashboard.fields import api_field
from dashboard.forms import OrgForm, add_service_error
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


@org_view(manage=True)
def rate_limit_new(request: HttpRequest, access: Access) -> HttpResponse:
    require_manage(access)
    form = RateLimitForm(request.POST or None, organization=access.organization)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        try:
            limit = services.create_rate_limit(
                organization=access.organization, actor=access.actor, scope=data.pop("scope"), **data
            )
        except InvalidChange as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Rate limit “{limit}” created.")
            return redirect("dashboard:rate_limits", access.organization.slug)
    return render_org(
        request,
        access,
        "dashboard/form.html",
        "rate_limits",
        form=form,
        title="New rate limit",
        submit="Create rate limit",
    )


@org_view(manage=True)
def rate_limit_edit(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
    require_manage(access)
    limit = get_object_or_404(RateLimit, pk=pk, organization=access.organization)
    initial = {
        f: getattr(limit, f) for f in ("name", *RateLimitForm.SUBJECT, "requests_per_minute", "tokens_per_minute")
    }
    form = RateLimitForm(request.POST or None, organization=access.organization, initial=initial, editing=True)
    if request.method == "POST" and form.is_valid():
        data = {k: v for k, v in form.cleaned_data.items() if k not in RateLimitForm.SUBJECT}
        try:
            services.update_rate_limit(limit=limit, actor=access.actor, **data)
        except InvalidChange as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Rate limit “{limit}” saved.")
            return redirect("dashboard:rate_limits", access.organization.slug)
    return render_org(
        request,
        access,
        "dashboard/form.html",
        "rate_limits",
        form=form,
        title=f"Edit rate limit “{limit}”",
        submit="Save",
        delete_url="dashboard:rate_limit_delete",
        obj=limit,
    )


@require_POST
@org_view(manage=True)
def rate_limit_delete(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
    limit = get_object_or_404(RateLimit, pk=pk, organization=access.organization)
    services.delete_rate_limit(limit=limit, actor=access.actor)
    messages.success(request, f"Rate limit “{limit}” deleted.")
    return redirect("dashboard:rate_limits", access.organization.slug)
