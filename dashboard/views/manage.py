"""Budgets, keys, projects and end customers: list, create, edit, delete. Each POST calls one
service; a service's InvalidChange comes back as a form error and nothing is changed."""

from __future__ import annotations

from operator import attrgetter
from typing import Any, cast
from urllib.parse import quote

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect
from django.utils import timezone

from alerts.selectors import keys_with_activity
from budgets import services as budget_services
from budgets.selectors import statuses
from core.errors import InvalidChange
from core.money import usd_input
from dashboard.access import org_view, render_org, require_manage
from dashboard.forms import BudgetForm, EndCustomerForm, KeyForm, ProjectForm, add_service_error
from dashboard.views.crud import Editor, Resource, delete_action, edit_page
from ledger.models import Budget
from tenants import services
from tenants.models import ApiKey, EndCustomer, Project
from tenants.selectors import Access

# --- budgets -------------------------------------------------------------------------------------


RUN_PAGE = 50  # per-run budgets per page of their tab
KEY_PAGE = 50  # gateway keys per page


@org_view()
def budgets(request: HttpRequest, access: Access) -> HttpResponse:
    """Standing budgets are listed whole. Per-run budgets (one per X-Capgate-Run id, made by the
    gateway on a run's first call) can number thousands, so they have a tab of their own: counted
    on the first tab, listed newest first, paginated and searchable by run id on theirs."""
    org = access.organization
    rows = org.budgets.select_related("project", "member__user", "api_key", "end_customer")
    runs = rows.filter(scope=Budget.Scope.RUN)
    tab = "runs" if request.GET.get("tab") == "runs" else "standing"
    search, page, query = "", None, ""
    if tab == "runs":
        search = request.GET.get("q", "").strip()[:200]
        if search:
            runs = runs.filter(run_id__icontains=search)
        query = "tab=runs" + (f"&q={quote(search)}" if search else "")
        page = Paginator(runs.order_by("-created_at", "-id"), RUN_PAGE).get_page(request.GET.get("page"))
        shown = list(page)
    else:
        shown = list(rows.exclude(scope=Budget.Scope.RUN).order_by("scope", "id"))
    return render_org(
        request,
        access,
        "dashboard/budgets.html",
        "budgets",
        statuses=statuses(budgets=shown, now=timezone.now()),
        tab=tab,
        run_count=org.budgets.filter(scope=Budget.Scope.RUN).count(),
        page=page,
        search=search,
        query=query,
    )


BUDGETS = Resource(Budget, "Budget", "budgets", delete_url="dashboard:budget_delete")
BUDGET_FIELDS = ("name", *BudgetForm.SUBJECT, "period", "timezone", "mode", "thresholds", "recipients")


class BudgetEditor(Editor):
    resource = BUDGETS
    new_submit = "Create budget"
    created = "created"

    def form(self, data: QueryDict | None, access: Access, row: Budget | None, query: QueryDict) -> BudgetForm:
        initial: dict[str, Any]
        if row is None:
            # "add budget" from a key, customer or project row preselects its scope and subject.
            initial = {k: query[k] for k in ("scope", *BudgetForm.SUBJECT) if k in query}
            return BudgetForm(data, organization=access.organization, initial=initial)
        initial = {f: getattr(row, f) for f in BUDGET_FIELDS}
        initial["amount_usd"] = usd_input(row.amount_nano)
        return BudgetForm(data, organization=access.organization, initial=initial, editing=True)

    def save(self, access: Access, row: Budget | None, form: BudgetForm) -> Budget:
        kwargs = form.service_kwargs()
        if row is None:
            return budget_services.create_budget(organization=access.organization, actor=access.actor, **kwargs)
        for name in BudgetForm.SUBJECT:  # scope and subject are fixed once created
            kwargs.pop(name, None)
        budget_services.update_budget(budget=row, actor=access.actor, **kwargs)
        return row


budget_edit = edit_page(BudgetEditor())
budget_delete = delete_action(BUDGETS, budget_services.delete_budget, instance="budget")


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
    # A page at a time: each key's spend and last use are read for the keys shown, not all.
    search = request.GET.get("q", "").strip()[:200]
    if search:
        rows = rows.filter(Q(name__icontains=search) | Q(prefix__startswith=search))
    page = Paginator(rows, KEY_PAGE).get_page(request.GET.get("page"))
    return render_org(
        request,
        access,
        "dashboard/keys.html",
        "keys",
        keys=page.object_list,
        page=page,
        search=search,
        query=f"q={quote(search)}" if search else "",
        form=form,
        created=created,
        now=now,
    )


KEYS = Resource(ApiKey, "Key", "keys", label=attrgetter("name"))


def _own_key(access: Access, key: ApiKey) -> None:
    if not access.can_manage_key(key):
        raise PermissionDenied("You can revoke only your own keys.")


# Members revoke their own keys, so the role check is the key's own (can_manage_key).
key_revoke = delete_action(KEYS, services.revoke_key, instance="key", verb="revoked", manage=False, check=_own_key)


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


class ProjectEditor(Editor):
    resource = Resource(Project, "Project", "projects")

    def form(self, data: QueryDict | None, access: Access, row: Project | None, query: QueryDict) -> ProjectForm:
        row = cast(Project, row)  # projects are created on their list page: only editing is routed here
        initial = {
            "slug": row.slug,
            "name": row.name,
            "default_customer_budget_usd": None
            if row.default_customer_budget_nano is None
            else usd_input(row.default_customer_budget_nano),
            "default_customer_budget_period": row.default_customer_budget_period,
            "default_customer_budget_mode": row.default_customer_budget_mode,
        }
        return ProjectForm(data, organization=access.organization, initial=initial)

    def save(self, access: Access, row: Project | None, form: ProjectForm) -> Project:
        row = cast(Project, row)
        services.update_project(project=row, actor=access.actor, **form.service_kwargs())
        return row


project_edit = edit_page(ProjectEditor())
customer_delete = delete_action(
    Resource(EndCustomer, "End customer", "projects", org_field="project__organization"),
    services.delete_end_customer,
    instance="customer",
)
