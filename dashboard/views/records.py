"""Read-only records: the usage log (filters, streamed CSV), alert history, the audit log."""

from __future__ import annotations

import csv
from collections.abc import AsyncIterator
from datetime import UTC, datetime, time, timedelta

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse

from alerts.selectors import UsageFilters, alert_events, totals, usage_records
from core.money import nano_to_usd
from dashboard.access import org_view, render_org
from dashboard.forms import UsageFilterForm
from tenants.models import AuditLogEntry, EndCustomer
from tenants.selectors import Access

CSV_COLUMNS = [
    "admitted_at",
    "request_id",
    "project",
    "key",
    "end_customer",
    "run_id",
    "model",
    "provider_model",
    "status",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cost_usd",
    "reserved_usd",
    "excess_usd",
    "latency_ms",
    "error",
]


def _filters(form: UsageFilterForm) -> UsageFilters:
    if not form.is_valid():
        return UsageFilters()
    d = form.cleaned_data
    customer_id = None
    if d.get("end_customer"):
        customer = EndCustomer.objects.filter(
            project__organization=form.organization, external_id=d["end_customer"]
        ).first()
        customer_id = customer.id if customer else -1  # unknown id: match nothing
    return UsageFilters(
        since=datetime.combine(d["since"], time.min, tzinfo=UTC) if d.get("since") else None,
        until=datetime.combine(d["until"] + timedelta(days=1), time.min, tzinfo=UTC) if d.get("until") else None,
        project_id=d["project"].id if d.get("project") else None,
        api_key_id=d["api_key"].id if d.get("api_key") else None,
        end_customer_id=customer_id,
        model=d.get("model") or None,
        status=d.get("status") or None,
    )


@org_view()
def usage(request: HttpRequest, access: Access) -> HttpResponse:
    form = UsageFilterForm(request.GET or None, organization=access.organization)
    filters = _filters(form)
    qs = (
        usage_records(organization=access.organization, filters=filters)
        .select_related("project", "api_key", "end_customer")
        .order_by("-admitted_at", "-id")
    )
    page = Paginator(qs, 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render_org(
        request,
        access,
        "dashboard/usage.html",
        "usage",
        form=form,
        page=page,
        totals=totals(organization=access.organization, filters=filters),
        query=query.urlencode(),
    )


class _Echo:
    def write(self, value: str) -> str:
        return value


@org_view()
def usage_csv(request: HttpRequest, access: Access) -> StreamingHttpResponse:
    """Streamed: an async iterator over aiterator() (a server-side cursor, 2,000 rows at a time),
    so under ASGI each row is sent as it is read — a large export starts at once and never sits
    whole in memory. A sync iterator would be consumed whole by Django's ASGI handler first."""
    form = UsageFilterForm(request.GET or None, organization=access.organization)
    qs = (
        usage_records(organization=access.organization, filters=_filters(form))
        .select_related("project", "api_key", "end_customer")
        .order_by("admitted_at", "id")
    )
    writer = csv.writer(_Echo())

    async def rows() -> AsyncIterator[str]:
        yield writer.writerow(CSV_COLUMNS)
        async for r in qs.aiterator(chunk_size=2000):
            yield writer.writerow(
                [
                    r.admitted_at.isoformat(),
                    r.request_id,
                    r.project.slug if r.project else "",
                    r.api_key.name if r.api_key else "",
                    r.end_customer.external_id if r.end_customer else "",
                    r.run_id or "",
                    r.model,
                    r.provider_model,
                    r.status,
                    r.input_tokens,
                    r.output_tokens,
                    r.cache_read_tokens,
                    r.cache_write_tokens,
                    f"{nano_to_usd(r.cost_nano):f}",
                    f"{nano_to_usd(r.reserved_nano):f}",
                    f"{nano_to_usd(r.excess_nano):f}",
                    r.latency_ms if r.latency_ms is not None else "",
                    r.error,
                ]
            )

    response = StreamingHttpResponse(rows(), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{access.organization.slug}-usage.csv"'
    return response


@org_view()
def alerts(request: HttpRequest, access: Access) -> HttpResponse:
    page = Paginator(alert_events(organization=access.organization), 50).get_page(request.GET.get("page"))
    return render_org(request, access, "dashboard/alerts.html", "alerts", page=page)


@org_view()
def audit(request: HttpRequest, access: Access) -> HttpResponse:
    entries = AuditLogEntry.objects.filter(organization=access.organization).order_by("-created_at", "-id")
    page = Paginator(entries, 50).get_page(request.GET.get("page"))
    return render_org(request, access, "dashboard/audit.html", "audit", page=page)
