"""GET /api/orgs/{slug}/requests/: the request log, filtered by RequestLogFilter."""

from __future__ import annotations

from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import serializers

from catalog.api import UsdField
from requestlog.filters import RequestLogFilter
from requestlog.models import RequestLogEntry
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


class RequestLogViewSet(OrgReadViewSet):
    """Every gateway request with its outcome: served, failed upstream, estimated, released
    (from the usage records) and refused, rate limited or rejected before admission."""

    model = RequestLogEntry
    serializer_class = RequestLogEntrySerializer
    filter_backends = [OrgFilterBackend]
    filterset_class = RequestLogFilter
    lookup_field = "request_id"
    lookup_value_regex = r"[-A-Za-z0-9_.:]{1,100}"

    def org_queryset(self):
        return request_log(organization=self.organization).select_related("end_customer")
