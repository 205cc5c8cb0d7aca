"""Management API (read-only): /api/orgs/{org}/jobs/ — provider jobs with their hold, age and
status, and the request that created each (its usage record's request id once settled)."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers

from catalog.api import UsdField
from jobs.models import Job
from jobs.selectors import jobs_of
from tenants.api.base import OrgReadViewSet


class JobFilterSerializer(serializers.Serializer):
    state = serializers.ChoiceField(choices=Job.State.choices, required=False)
    kind = serializers.ChoiceField(choices=Job.Kind.choices, required=False)
    live = serializers.BooleanField(
        required=False, default=False, help_text="only jobs still held (live or cancelling)"
    )


class JobSerializer(serializers.ModelSerializer):
    worst_usd = UsdField(source="worst_nano", read_only=True)
    held_usd = UsdField(
        source="held_nano",
        read_only=True,
        allow_null=True,
        help_text="what the job's reservation holds now; null once settled",
    )
    cost_usd = UsdField(source="cost_nano", read_only=True, allow_null=True)
    lease_expires_at = serializers.DateTimeField(read_only=True, allow_null=True)
    age_seconds = serializers.SerializerMethodField()
    api_key = serializers.CharField(source="api_key.name", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Job
        fields = [
            "id",
            "kind",
            "provider_job_id",
            "state",
            "provider_status",
            "route",
            "request_id",
            "api_key",
            "worst_usd",
            "held_usd",
            "cost_usd",
            "created_at",
            "age_seconds",
            "lease_expires_at",
            "deadline_at",
            "cancel_requested_at",
            "polls",
            "last_polled_at",
            "settled_at",
            "detail",
        ]
        read_only_fields = fields

    def get_age_seconds(self, job: Job) -> int:
        return int((timezone.now() - job.created_at).total_seconds())


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter("state", OpenApiTypes.STR, enum=Job.State.values),
            OpenApiParameter("kind", OpenApiTypes.STR, enum=Job.Kind.values),
            OpenApiParameter("live", OpenApiTypes.BOOL),
        ]
    )
)
class JobViewSet(OrgReadViewSet):
    """Provider jobs (batches, message batches, background responses, videos) of the organization."""

    model = Job
    serializer_class = JobSerializer

    def org_queryset(self):
        if self.action == "list":
            params = JobFilterSerializer(data=self.request.query_params)
            params.is_valid(raise_exception=True)
            v = params.validated_data
            return jobs_of(
                organization_id=self.organization.id, state=v.get("state"), live=v.get("live"), kind=v.get("kind")
            )
        return jobs_of(organization_id=self.organization.id)
