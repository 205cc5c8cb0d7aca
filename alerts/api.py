"""Management API (read-only): the usage log, its totals by group, and alert events."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from alerts.models import AlertEvent
from alerts.selectors import GROUPS, UsageFilters, alert_events, totals, usage_records, usage_summary
from catalog.api import UsdField
from ledger.models import UsageRecord
from tenants.api.base import OrgReadViewSet
from tenants.api.fields import WholeNumberField


class UsageFilterSerializer(serializers.Serializer):
    since = serializers.DateTimeField(required=False, help_text="admitted at or after (ISO 8601)")
    until = serializers.DateTimeField(required=False, help_text="admitted before (ISO 8601)")
    # ids in ASCII digits (DRF's IntegerField reads "١" as 1 and "1_0" as 10)
    project = WholeNumberField(required=False, min_value=1, max_value=2**63 - 1)
    api_key = WholeNumberField(required=False, min_value=1, max_value=2**63 - 1)
    end_customer = WholeNumberField(required=False, min_value=1, max_value=2**63 - 1)
    model = serializers.CharField(required=False, max_length=200)
    status = serializers.ChoiceField(choices=UsageRecord.Status.choices, required=False)

    def filters(self) -> UsageFilters:
        v = self.validated_data
        return UsageFilters(
            since=v.get("since"),
            until=v.get("until"),
            project_id=v.get("project"),
            api_key_id=v.get("api_key"),
            end_customer_id=v.get("end_customer"),
            model=v.get("model"),
            status=v.get("status"),
        )


class SummarySerializer(UsageFilterSerializer):
    group_by = serializers.ChoiceField(choices=list(GROUPS), default="day")


class UsageRecordSerializer(serializers.ModelSerializer):
    cost_usd = UsdField(source="cost_nano", read_only=True)
    reserved_usd = UsdField(source="reserved_nano", read_only=True)
    excess_usd = UsdField(source="excess_nano", read_only=True)

    class Meta:
        model = UsageRecord
        fields = [
            "id",
            "request_id",
            "admitted_at",
            "project",
            "member",
            "api_key",
            "end_customer",
            "run_id",
            "connection",
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
            "error",
            "latency_ms",
            "applied",
        ]
        read_only_fields = fields


class SummaryRowSerializer(serializers.Serializer):
    group = serializers.CharField(allow_null=True, help_text="the day, project slug, key name, model, ...")
    requests = serializers.IntegerField()
    cost_usd = UsdField(source="cost_nano")
    excess_usd = UsdField(source="excess_nano")
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()


class SummaryResponseSerializer(serializers.Serializer):
    group_by = serializers.CharField()
    total = SummaryRowSerializer()
    groups = SummaryRowSerializer(many=True)


_FILTER_PARAMS = [
    OpenApiParameter("since", OpenApiTypes.DATETIME),
    OpenApiParameter("until", OpenApiTypes.DATETIME),
    OpenApiParameter("project", OpenApiTypes.INT),
    OpenApiParameter("api_key", OpenApiTypes.INT),
    OpenApiParameter("end_customer", OpenApiTypes.INT),
    OpenApiParameter("model", OpenApiTypes.STR),
    OpenApiParameter("status", OpenApiTypes.STR, enum=UsageRecord.Status.values),
]


@extend_schema_view(list=extend_schema(parameters=_FILTER_PARAMS))
class UsageViewSet(OrgReadViewSet):
    model = UsageRecord
    serializer_class = UsageRecordSerializer

    def org_queryset(self):
        if self.action == "list":
            params = UsageFilterSerializer(data=self.request.query_params)
            params.is_valid(raise_exception=True)
            # Newest first, by id: a stable order, so limit/offset pages neither repeat nor skip rows.
            return usage_records(organization=self.organization, filters=params.filters()).order_by("-id")
        return UsageRecord.objects.filter(organization=self.organization)

    @extend_schema(
        parameters=[*_FILTER_PARAMS, OpenApiParameter("group_by", OpenApiTypes.STR, enum=list(GROUPS))],
        responses=SummaryResponseSerializer,
    )
    @action(detail=False, methods=["get"])
    def summary(self, request, *args, **kwargs):
        """Totals and per-group aggregates (by day, project, key, model, end customer, status)."""
        params = SummarySerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        filters = params.filters()
        group_by = params.validated_data["group_by"]
        rows = usage_summary(organization=self.organization, filters=filters, group_by=group_by)
        for row in rows:
            row["group"] = row["group"].date().isoformat() if group_by == "day" and row["group"] else row["group"]
        total = {k: v or 0 for k, v in totals(organization=self.organization, filters=filters).items()}
        return Response(
            SummaryResponseSerializer({"group_by": group_by, "total": {"group": None, **total}, "groups": rows}).data
        )


class AlertEventSerializer(serializers.ModelSerializer):
    spent_usd = UsdField(source="spent_nano", read_only=True)
    reserved_usd = UsdField(source="reserved_nano", read_only=True)
    amount_usd = UsdField(source="amount_nano", read_only=True)
    budget_name = serializers.CharField(source="budget.__str__", read_only=True)

    class Meta:
        model = AlertEvent
        fields = [
            "id",
            "budget",
            "budget_name",
            "window",
            "kind",
            "threshold",
            "spent_usd",
            "reserved_usd",
            "amount_usd",
            "detail",
            "created_at",
            "status",
            "attempts",
            "last_error",
            "recipients",
            "sent_at",
        ]
        read_only_fields = fields


class AlertEventViewSet(OrgReadViewSet):
    """Alert history: thresholds crossed, first refusals, audit drift — with delivery status."""

    model = AlertEvent
    serializer_class = AlertEventSerializer

    def org_queryset(self):
        return alert_events(organization=self.organization)
