"""Budgets, keys, projects and end customers: list, create, edit, delete. Each POST calls one
service; a service's InvalidChange comes back as a form error and nothing is changed."""

from __future__ import annotations

from urllib.parse import quote

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_POST

from alerts.selectors import keys_with_activity
from budgets import services as budget_services
from budgets.selectors import statuses
from core.errors import InvalidChange
from core.money import usd_input
from dashboard.access import org_view, render_org, require_manage
from dashboard.forms import BudgetForm, EndCustomerForm, KeyForm, ProjectForm, add_service_error
from ledger.models import Budget
from tenants import services
from tenants.models import ApiKey, EndCustomer, Project
from tenants.selectors import Access

# --- budgets -------------------------------------------------------------------------------------


@org_view()
def budgets(request: HttpRequest, access: Access) -> HttpResponse:
    rows = list(
        access.organization.budgets.select_related("project", "member__user", "api_key", "end_customer").order_by(
            "scope", "id"
        )
    )
    return render_org(
        request, access, "dashboard/budgets.html", "budgets", statuses=statuses(budgets=rows, now=timezone.now())
    )


@org_view(manage=True)
def budget_new(request: HttpRequest, access: Access) -> HttpResponse:
    require_manage(access)
    # "add budget" from a key, customer or project row preselects its scope and subject.
    initial = {k: request.GET[k] for k in ("scope", *BudgetForm.SUBJECT) if k in request.GET}
    form = BudgetForm(request.POST or None, organization=access.organization, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            budget = budget_services.create_budget(
                organization=access.organization, actor=access.actor, **form.service_kwargs()
            )
        except InvalidChange as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Budget “{budget}” created.")
            return redirect("dashboard:budgets", access.organization.slug)
    return render_org(
        request, access, "dashboard/form.html", "budgets", form=form, title="New budget", submit="Create budget"
    )


@org_view(manage=True)
def budget_edit(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
    require_manage(access)
    budget = get_object_or_404(Budget, pk=pk, organization=access.organization)
    initial = {
        f: getattr(budget, f)
        for f in (
            "name",
            "scope",
            "project",
            "member",
            "api_key",
            "end_customer",
            "run_id",
            "period",
            "timezone",
            "mode",
            "thresholds",
            "recipients",
        )
    }
    initial["amount_usd"] = usd_input(budget.amount_nano)
    form = BudgetForm(request.POST or None, organization=access.organization, initial=initial, editing=True)
    if request.method == "POST" and form.is_valid():
        kwargs = form.service_kwargs()
        for name in BudgetForm.SUBJECT:
            kwargs.pop(name, None)
        try:
            budget_services.update_budget(budget=budget, actor=access.actor, **kwargs)
        except InvalidChange as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, f"Budget “{budget}” saved.")
            return redirect("dashboard:budgets", access.organization.slug)
    return render_org(
        request,
        access,
        "dashboard/form.html",
        "budgets",
        form=form,
        title=f"Edit budget “{budget}”",
        submit="Save",
        delete_url="dashboard:budget_delete",
        obj=budget,
    )


@require_POST
@org_view(manage=True)
def budget_delete(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
    budget = get_object_or_404(Budget, pk=pk, organization=access.organization)
    budget_services.delete_budget(budget=budget, actor=access.actor)
    messages.success(request, f"Budget “{budget}” deleted.")
    return redirect("dashboard:budgets", access.organization.slug)


# --- keys ----------------------------------------------------------------------------------------


@org_view()
def keys(request: HttpRequest, access: Access) -> HttpResponse:
    org = access.organization
    form = KeyForm(request.POST or None, organization=org, can_choose_member=access.can_manage)
    created = None
    if request.method == "POST":
        if not access.can_manage_own_keys:
            raise PermissionDenied("Viewers cannot create keys.")
        if form.is_valid():
            d = form.cleaned_data
            member = d.get("member") if access.can_manage else access.member
            try:
                key, raw = services.create_key(
                    organization=org,
                    project=d["project"],
                    name=d["name"],
                    member=member,
                    allowed_models=d["allowed_models"],
                    expires_at=d["expires_at"],
                    default_max_output_tokens=d["default_max_output_tokens"],
                    actor=access.actor,
                )
            except InvalidChange as exc:
                add_service_error(form, exc)
            else:
                # Rendered once, in this response only: it is not stored and never shown again.
                created = (key, raw)
                form = KeyForm(organization=org, can_choose_member=access.can_manage)
    now = timezone.now()
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    rows = (
        keys_with_activity(organization=org, since=month_start)
        .select_related("project", "member__user")
        .order_by("revoked_at", "-id")
    )
    return render_org(request, access, "dashboard/keys.html", "keys", keys=rows, form=form, created=created, now=now)


@require_POST
@org_view()
def key_revoke(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
    key = get_object_or_404(ApiKey, pk=pk, organization=access.organization)
    if not access.can_manage_key(key):
        raise PermissionDenied("You can revoke only your own keys.")
    services.revoke_key(key=key, actor=access.actor)
    messages.success(request, f"Key “{key.name}” revoked.")
    return redirect("dashboard:keys", access.organization.slug)


# --- projects and end customers ------------------------------------------------------------------


@org_view(manage=True)
def projects(request: HttpRequest, access: Access) -> HttpResponse:
    org = access.organization
    project_form = ProjectForm(request.POST if "create_project" in request.POST else None, organization=org)
    customer_form = EndCustomerForm(request.POST if "create_customer" in request.POST else None, organization=org)
    if request.method == "POST":
        require_manage(access)
        try:
            if "create_project" in request.POST and project_form.is_valid():
                d = project_form.service_kwargs()
                services.create_project(
                    organization=org, slug=d.pop("slug"), name=d.pop("name"), actor=access.actor, **d
                )
                messages.success(request, "Project created.")
                return redirect("dashboard:projects", org.slug)
            if "create_customer" in request.POST and customer_form.is_valid():
                d = customer_form.cleaned_data
                services.create_end_customer(project=d["project"], external_id=d["external_id"], actor=access.actor)
                messages.success(request, "End customer added.")
                return redirect("dashboard:projects", org.slug)
        except InvalidChange as exc:
            add_service_error(project_form if "create_project" in request.POST else customer_form, exc)
    customers = (
        EndCustomer.objects.filter(project__organization=org)
        .select_related("project")
        .order_by("project__name", "external_id", "id")
    )
    search = request.GET.get("q", "").strip()[:200]
    if search:
        customers = customers.filter(external_id__icontains=search)
    page = Paginator(customers, 50).get_page(request.GET.get("page"))
    return render_org(
        request,
        access,
        "dashboard/projects.html",
        "projects",
        projects=org.projects.order_by("name"),
        page=page,
        search=search,
        query=f"q={quote(search)}" if search else "",
        project_form=project_form,
        customer_form=customer_form,
    )


@org_view(manage=True)
def project_edit(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
    require_manage(access)
    project = get_object_or_404(Project, pk=pk, organization=access.organization)
    initial = {
        "slug": project.slug,
        "name": project.name,
        "default_customer_budget_usd": None
        if project.default_customer_budget_nano is None
        else usd_input(project.default_customer_budget_nano),
        "default_customer_budget_period": project.default_customer_budget_period,
        "default_customer_budget_mode": project.default_customer_budget_mode,
    }
    form = ProjectForm(request.POST or None, organization=access.organization, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.update_project(project=project, actor=access.actor, **form.service_kwargs())
        except InvalidChange as exc:
            add_service_error(form, exc)
        else:
            messages.success(request, "Project saved.")
            return redirect("dashboard:projects", access.organization.slug)
    return render_org(
        request, access, "dashboard/form.html", "projects", form=form, title=f"Edit project {project}", submit="Save"
    )


@require_POST
@org_view(manage=True)
def customer_delete(request: HttpRequest, access: Access, pk: int) -> HttpResponse:
    customer = get_object_or_404(EndCustomer, pk=pk, project__organization=access.organization)
    services.delete_end_customer(customer=customer, actor=access.actor)
    messages.success(request, f"End customer {customer} deleted.")
    return redirect("dashboard:projects", access.organization.slug)
