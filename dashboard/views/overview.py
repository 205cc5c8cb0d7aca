"""Home, organization switcher and the per-organization overview."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from django.contrib.auth.decorators import login_required
from django.db.models import Count, Sum
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from alerts.models import AuditRun
from alerts.selectors import GROUPS, daily_spend
from budgets.selectors import live_reservations, statuses
from dashboard.access import org_view, render_org
from dashboard.charts import stacked_daily
from ledger.models import Budget
from ledger.spool import dead_letter_count
from requestlog.selectors import refusals_by_code
from tenants.selectors import Access, organizations_for

CHART_DAYS = 30
REFUSAL_DAYS = 7  # the refusals panel: a week of refused requests, by code
CHART_GROUPS = [g for g in GROUPS if g not in ("day", "status")]
CHART_LABELS = [(g, g.replace("_", " ")) for g in CHART_GROUPS]


@login_required
def home(request: HttpRequest) -> HttpResponse:
    orgs = list(organizations_for(request.user))
    if len(orgs) == 1:
        return redirect("dashboard:overview", orgs[0].slug)
    return render(request, "dashboard/home.html", {"organizations": orgs})


@login_required
def switch(request: HttpRequest) -> HttpResponse:
    slug = request.GET.get("org", "")
    if not organizations_for(request.user).filter(slug=slug).exists():
        raise Http404("No such organization.")
    return redirect("dashboard:overview", slug)


@org_view()
def overview(request: HttpRequest, access: Access) -> HttpResponse:
    org = access.organization
    now = timezone.now()
    # Per-run budgets (thousands, one per run id) are counted here and listed on their own tab.
    budgets = list(
        org.budgets.exclude(scope=Budget.Scope.RUN)
        .select_related("project", "member__user", "api_key", "end_customer")
        .order_by("scope", "id")
    )
    # cast: the branch runs only when the value is one of CHART_GROUPS (so not None).
    group_by = cast(str, request.GET.get("by")) if request.GET.get("by") in CHART_GROUPS else "project"
    start = (now - timedelta(days=CHART_DAYS - 1)).date()
    since = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=CHART_DAYS - 1)
    chart = stacked_daily(
        rows=daily_spend(organization=org, since=since, group_by=group_by), start=start, days=CHART_DAYS
    )
    reservations = live_reservations(organization_id=org.id)
    held = reservations.aggregate(n=Count("id"), total=Sum("amount_nano"))
    last_audit = AuditRun.objects.filter(finished_at__isnull=False).order_by("-started_at").first()
    org_drifts = [d for d in (last_audit.drifts if last_audit else []) if d.get("organization_id") == org.id]
    return render_org(
        request,
        access,
        "dashboard/overview.html",
        "overview",
        statuses=statuses(budgets=budgets, now=now),
        run_count=org.budgets.filter(scope=Budget.Scope.RUN).count(),
        chart=chart,
        group_by=group_by,
        chart_groups=CHART_LABELS,
        chart_days=CHART_DAYS,
        refusals=refusals_by_code(organization=org, since=now - timedelta(days=REFUSAL_DAYS)),
        refusal_days=REFUSAL_DAYS,
        reservations=reservations[:10],
        held_count=held["n"] or 0,
        held_nano=held["total"] or 0,
        last_audit=last_audit,
        org_drifts=org_drifts,
        dead_letters=dead_letter_count(organization_id=org.id),
    )
