"""GET /api/orgs/{slug}/requests/: the request log, filtered by RequestLogFilter."""

from __future__ import annotations

from typing import Any

from django_filters.rest_framework import DjangoFilterBackend
from django_filters.utils import translate_validation
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from catalog.api import UsdField
from core.pagination import Pagination
from requestlog.filters import RequestLogFilter
from requestlog.models import RequestLogEntry
from requestlog.pages import Cursor, InvalidCursor, Page, request_log_page
from requestlog.selectors import request_log
from tenants.api.base import OrgReadViewSet


class RequestLogEntrySerializer(serializers.ModelSerializer):
    customer = serializers.CharField(source="end_customer.external_id", default=None, read_only=True)
    cost_usd = UsdField(source="cost_nano", read_only=True)
    reserved_usd = UsdField(
        source="reserved_nano",
        read_only=True,
        help_text="the worst case reserved (admitted) or refused (a ceiling's 402)",
    )
    excess_usd = UsdField(source="excess_nano", read_only=True)

    class Meta:
        model = RequestLogEntry
        fields = [
            "request_id",
            "at",
            "status",
            "code",
            "http_status",
            "project",
            "member",
            "api_key",
            "end_customer",
            "customer",
            "run_id",
            "model",
            "provider_model",
            "connection",
            "budget",
            "input_tokens",
            "output_tokens",
            "reserved_usd",
            "input_bound",
            "cost_usd",
            "excess_usd",
            "latency_ms",
            "message",
            "job_id",
        ]
        read_only_fields = fields


class OrgFilterBackend(DjangoFilterBackend):
    """django-filter's backend, with the project and key choices limited to the view's organization."""

    def get_filterset_kwargs(self, request, queryset, view):
        kwargs = super().get_filterset_kwargs(request, queryset, view)
        if not getattr(view, "swagger_fake_view", False):
            kwargs["organization"] = view.organization
        return kwargs

    def filter_queryset(self, request, queryset, view):
        """As django-filter's (a bad filter is a 400), keeping the cleaned filters on the view
        for the keyset pagination, which reads the two tables, not the filtered view."""
        filterset = self.get_filterset(request, queryset, view)
        if filterset is None:
            return queryset
        if not filterset.is_valid():
            raise translate_validation(filterset.errors)
        view.filters = filterset.form.cleaned_data
        return filterset.qs


class KeysetPagination(Pagination):
    """`?limit=&cursor=`, answered as {next, previous, results}: each page is read by keyset
    (requestlog/pages.py), so its cost is its own rows, not the history before it; there is
    no count. `limit` is read as everywhere in /api (core/pagination.py); `cursor` is the
    opaque token of a `next` or `previous` link, and any other value is a 400."""

    cursor_query_param = "cursor"

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> Any:
        self.uri: str = request.build_absolute_uri()
        self.limit = self.get_limit(request) or self.default_limit or self.max_limit
        if self.offset_query_param in request.query_params:  # a loop of offsets would never end
            raise ValidationError({self.offset_query_param: ["The request log pages by cursor: follow `next`."]})
        token = request.query_params.get(self.cursor_query_param)
        try:
            cursor = None if token is None else Cursor.decode(token)
        except InvalidCursor as exc:
            raise ValidationError({self.cursor_query_param: [str(exc)]}) from exc
        self.page: Page = request_log_page(
            organization=view.organization, filters=view.filters, limit=int(self.limit), cursor=cursor
        )
        return self.page.rows

    def _link(self, cursor: Cursor | None) -> str | None:
        if cursor is None:
            return None
        return replace_query_param(self.uri, self.cursor_query_param, cursor.encode())

    def get_paginated_response(self, data: Any) -> Response:
        return Response({"next": self._link(self.page.older), "previous": self._link(self.page.newer), "results": data})

    def get_paginated_response_schema(self, schema: dict) -> dict:
        link = {"type": "string", "nullable": True, "format": "uri"}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {"next": link, "previous": link, "results": schema},
        }

    def get_schema_operation_parameters(self, view: Any) -> list[dict]:
        limit, _offset = super().get_schema_operation_parameters(view)
        cursor = {
            "name": self.cursor_query_param,
            "required": False,
            "in": "query",
            "description": "the token of a `next` (older rows) or `previous` (newer rows) link",
            "schema": {"type": "string"},
        }
        return [limit, cursor]


class RequestLogViewSet(OrgReadViewSet):
    """Every gateway request with its outcome: served, failed upstream, estimated, released
    (from the usage records) and refused, rate limited or rejected before admission, newest
    first, paged by cursor."""

    model = RequestLogEntry
    pagination_class = KeysetPagination
    filters: dict[str, Any] = {}  # noqa: RUF012  (set per request by OrgFilterBackend)
    serializer_class = RequestLogEntrySerializer
    filter_backends = [OrgFilterBackend]
    filterset_class = RequestLogFilter
    lookup_field = "request_id"
    lookup_value_regex = r"[-A-Za-z0-9_.:]{1,100}"

    def org_queryset(self):
        return request_log(organization=self.organization).select_related("end_customer")
