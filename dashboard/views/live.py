"""Pages that refresh themselves: live reservations (htmx polls for the fragment only), and the
htmx script they use.

The script is served by Django from the django-htmx package, not through STATIC_URL: like the
inlined stylesheet, the dashboard then works behind any ASGI/WSGI server without a static-files
step (static files are only served under DEBUG here)."""

from __future__ import annotations

import functools
from pathlib import Path

import django_htmx
from django.core.paginator import Paginator
from django.db.models import Count, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from budgets.selectors import live_reservations
from dashboard.access import org_view, render_org
from jobs.selectors import jobs_of
from tenants.selectors import Access

# Seconds between polls; the page says so.
RESERVATIONS_REFRESH = 5
HTMX_SCRIPT = Path(django_htmx.__file__).parent / "static" / "django_htmx" / "htmx-2.min.js"


@functools.cache
def _htmx_source() -> bytes:
    return HTMX_SCRIPT.read_bytes()


@require_GET
@cache_control(public=True, max_age=86400)
def htmx_js(request: HttpRequest) -> HttpResponse:
    return HttpResponse(_htmx_source(), content_type="text/javascript; charset=utf-8")


@org_view()
def reservations(request: HttpRequest, access: Access) -> HttpResponse:
    """Every live reservation of the organization: what is held right now, by whom, until when.
    An htmx poll gets only the fragment (`_reservations_live.html`)."""
    rows = live_reservations(organization_id=access.organization.id)
    held = rows.aggregate(n=Count("id"), total=Sum("amount_nano"))
    page = Paginator(rows, 100).get_page(request.GET.get("page"))
    template = "dashboard/_reservations_live.html" if request.htmx else "dashboard/reservations.html"  # type: ignore[attr-defined]
    return render_org(
        request,
        access,
        template,
        "overview",
        page=page,
        held_count=held["n"] or 0,
        held_nano=held["total"] or 0,
        now=timezone.now(),
        refresh=RESERVATIONS_REFRESH,
    )


@org_view()
def jobs(request: HttpRequest, access: Access) -> HttpResponse:
    """Provider jobs still held (batches, background responses, videos): their hold, age and
    provider status, each linked to the request that created it. `?all=1` lists settled ones too.
    An htmx poll gets only the fragment (`_jobs_live.html`)."""
    show_all = request.GET.get("all") == "1"
    rows = jobs_of(organization_id=access.organization.id, live=not show_all)
    page = Paginator(rows, 100).get_page(request.GET.get("page"))
    template = "dashboard/_jobs_live.html" if request.htmx else "dashboard/jobs.html"  # type: ignore[attr-defined]
    return render_org(
        request,
        access,
        template,
        "overview",
        page=page,
        show_all=show_all,
        now=timezone.now(),
        refresh=RESERVATIONS_REFRESH,
    )
