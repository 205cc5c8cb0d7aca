"""Management API: rate limits (requests and tokens per minute) per organization, project, key
or end customer — declared like budgets."""

from __future__ import annotations

from rest_framework import serializers

from ratelimits import services
from ratelimits.models import RateLimit
from tenants.api.base import OrgCrudViewSet, Writes
from tenants.api.fields import WholeNumberField, choice_field, range_messages
from tenants.api.refs import EndCustomerRefField, OrgRelatedField
from tenants.models import ApiKey, EndCustomer, Project

# The service's words for a bad limit, whichever way it is bad.
PER_MINUTE = range_messages(f"A whole number from 1 to {services.MAX_PER_MINUTE:,}, or empty.")


class RateLimitSerializer(serializers.ModelSerializer):
    name = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        help_text="What a refused caller reads (Retry-After comes with it).",
    )
    scope = choice_field("Scope", RateLimit.Scope.choices)
    project = OrgRelatedField(
        org_path="organization", by="slug", queryset=Project.objects.all(), required=False, allow_null=True
    )
    api_key = OrgRelatedField(
        org_path="organization", by="name", queryset=ApiKey.objects.all(), required=False, allow_null=True
    )
    end_customer = EndCustomerRefField(queryset=EndCustomer.objects.all(), required=False, allow_null=True)
    requests_per_minute = WholeNumberField(
        min_value=1, max_value=services.MAX_PER_MINUTE, required=False, allow_null=True, error_messages=PER_MINUTE
    )
    tokens_per_minute = WholeNumberField(
        min_value=1,
        max_value=services.MAX_PER_MINUTE,
        required=False,
        allow_null=True,
        error_messages=PER_MINUTE,
        help_text="Tokens as admission bounds them: the input bound plus the output ceiling.",
    )

    class Meta:
        model = RateLimit
        fields = [
            "id",
            "name",
            "scope",
            "project",
            "api_key",
            "end_customer",
            "requests_per_minute",
            "tokens_per_minute",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]
        validators: list = []


class RateLimitViewSet(OrgCrudViewSet):
    """Rate limits of every scope. Over one, a gateway call gets 429 with Retry-After and the
    limit's name, and nothing is reserved or charged. Scope and subject are fixed once created."""

    model = RateLimit
    serializer_class = RateLimitSerializer
    writes = Writes(
        instance="limit",
        create=services.create_rate_limit,
        update=services.update_rate_limit,
        delete=services.delete_rate_limit,
    )
