"""The request log: every gateway request (filters, search by request id, customer and run),
one request's detail with the alerts it tipped, and a CSV export streamed as it is read."""

from __future__ import annotations

import csv
from collections.abc import AsyncIterator

from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse

from alerts.models import AlertEvent
from core.money import nano_to_usd
from dashboard.access import org_view, render_org
from requestlog.filters import RequestLogFilter
from requestlog.pages import Cursor, InvalidCursor, Page, request_log_page
from requestlog.selectors import request_entry, request_log
from tenants.selectors import Access

PAGE_SIZE = 50

CSV_COLUMNS = [
    "at",
    "request_id",
    "status",
    "code",
    "http_status",
    "project",
    "key",
    "customer",
    "run_id",
    "model",
    "provider_model",
    "connection",
    "budget",
    "input_tokens",
    "output_tokens",
    "reserved_usd",
    "cost_usd",
    "excess_usd",
    "latency_ms",
    "message",
]


def _filtered(request: HttpRequest, access: Access) -> tuple[RequestLogFilter, bool]:
    filterset = RequestLogFilter(
        request.GET or None, queryset=request_log(organization=access.organization), organization=access.organization
    )
    return filterset, not filterset.is_bound or filterset.is_valid()


@org_view()
def requests(request: HttpRequest, access: Access) -> HttpResponse:
    """A page of PAGE_SIZE rows, newest first, read by keyset (requestlog/pages.py): Newer and
    Older links carry the cursor; there is no page count. A cursor this page did not write
    is a 400, as a bad filter is."""
    filterset, valid = _filtered(request, access)
    query = request.GET.copy()
    token = query.pop("cursor", [None])[-1]
    query.pop("page", None)
    try:
        cursor = None if token is None else Cursor.decode(token)
    except InvalidCursor as exc:
        filterset.form.add_error(None, str(exc))
        valid = False
    if valid:
        page = request_log_page(
            organization=access.organization,
            filters=filterset.form.cleaned_data if filterset.is_bound else {},
            limit=PAGE_SIZE,
            cursor=cursor,
        )
    else:
        page = Page(rows=[], older=None, newer=None)
    response = render_org(
        request,
        access,
        "dashboard/requests.html",
        "requests",
        filterset=filterset,
        page=page,
        older=page.older and page.older.encode(),
        newer=page.newer and page.newer.encode(),
        query=query.urlencode(),
    )
    if not valid:
        response.status_code = 400
    return response


@org_view()
def request_detail(request: HttpRequest, access: Access, request_id: str) -> HttpResponse:
    entry = request_entry(organization=access.organization, request_id=request_id)
    if entry is None:
        raise Http404("No such request.")
    alerts = (
        AlertEvent.objects.filter(organization=access.organization, tipped_by__request_id=request_id)
        .select_related("budget")
        .order_by("created_at")
    )
    return render_org(request, access, "dashboard/request_detail.html", "requests", entry=entry, alerts=alerts)


class _Echo:
    def write(self, value: str) -> str:
        return value


@org_view()
def requests_csv(request: HttpRequest, access: Access) -> HttpResponse | StreamingHttpResponse:
    """Streamed: an async iterator, so under ASGI each chunk of rows is read (aiterator: a
    server-side cursor, 2,000 rows at a time) and sent before the next is read — a large
    export starts at once and never sits whole in memory. A sync iterator would be consumed
    whole by Django's ASGI handler before the first byte went out."""
    filterset, valid = _filtered(request, access)
    if not valid:
        return HttpResponse(filterset.errors.as_text(), status=400, content_type="text/plain")
    qs = filterset.qs.select_related("project", "api_key", "end_customer", "connection", "budget").order_by(
        "at", "request_id"
    )
    writer = csv.writer(_Echo())

    async def rows() -> AsyncIterator[str]:
        yield writer.writerow(CSV_COLUMNS)
        async for r in qs.aiterator(chunk_size=2000):
            yield writer.writerow(
                [
                    r.at.isoformat(),
                    r.request_id,
                    r.status,
                    r.code,
                    r.http_status or "",
                    r.project.slug if r.project else "",
                    r.api_key.name if r.api_key else "",
                    r.end_customer.external_id if r.end_customer else "",
                    r.run_id or "",
                    r.model,
                    r.provider_model,
                    r.connection.name if r.connection else "",
                    r.budget.name if r.budget else "",
                    r.input_tokens,
                    r.output_tokens,
                    f"{nano_to_usd(r.reserved_nano):f}",
                    f"{nano_to_usd(r.cost_nano):f}",
                    f"{nano_to_usd(r.excess_nano):f}",
                    r.latency_ms if r.latency_ms is not None else "",
                    r.message,
                ]
            )

    response = StreamingHttpResponse(rows(), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{access.organization.slug}-requests.csv"'
    return response
