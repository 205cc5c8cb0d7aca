"""Management API: budgets (with their current window), reservations (read), and the budget
policy that lives on organizations and projects (default run budget, default end-customer cap)."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers

from budgets import services
from budgets.selectors import current_status
from catalog.fields import UsdField
from ledger.models import Budget, Reservation
from tenants import services as tenant_services
from tenants.api.base import OrgCrudViewSet, OrgReadViewSet, Writes
from tenants.api.fields import EmailAddressField, WholeNumberField, choice_field
from tenants.api.refs import EndCustomerRefField, OrgRelatedField
from tenants.models import ApiKey, ApiToken, EndCustomer, Member, Organization, Project
from tenants.selectors import organizations_for

# --- organizations -------------------------------------------------------------------------------


class OrganizationSerializer(serializers.ModelSerializer):
    default_run_budget_usd = UsdField(source="default_run_budget_nano", required=False, allow_null=True)

    class Meta:
        model = Organization
        fields = ["slug", "name", "allow_unpriced", "default_run_budget_usd", "created_at"]
        read_only_fields = ["slug", "created_at"]


@extend_schema(tags=["organizations"])  # its paths are the prefix the other resources' tags strip
class OrganizationViewSet(OrgReadViewSet, mixins.UpdateModelMixin):
    """The organizations the caller belongs to (a token: its own). Owners and admins (and write
    tokens) set the unpriced-model policy and the default run budget."""

    model = Organization
    serializer_class = OrganizationSerializer
    lookup_field = "slug"
    lookup_url_kwarg = "org_slug"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"
    writes = Writes(instance="organization", update=tenant_services.update_organization)

    def org_queryset(self):
        # The caller's organizations, not one organization's rows (the list has no org_slug).
        if isinstance(self.request.auth, ApiToken):
            return Organization.objects.filter(pk=self.request.auth.organization_id)
        return organizations_for(self.request.user)


# --- projects ------------------------------------------------------------------------------------


class ProjectSerializer(serializers.ModelSerializer):
    slug = serializers.SlugField(max_length=100)
    default_customer_budget_usd = UsdField(
        source="default_customer_budget_nano",
        required=False,
        allow_null=True,
        help_text="Cap for each end customer without one.",
    )
    default_customer_budget_period = choice_field("Period", Budget.Period.choices, required=False)
    default_customer_budget_mode = choice_field("Mode", Budget.Mode.choices, required=False)

    class Meta:
        model = Project
        fields = [
            "id",
            "slug",
            "name",
            "default_customer_budget_usd",
            "default_customer_budget_period",
            "default_customer_budget_mode",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]
        validators: list = []


class ProjectViewSet(OrgCrudViewSet):
    model = Project
    serializer_class = ProjectSerializer
    writes = Writes(
        instance="project",
        create=tenant_services.create_project,
        update=tenant_services.update_project,
        delete=tenant_services.delete_project,
    )


# --- budgets -------------------------------------------------------------------------------------


class WindowStatusSerializer(serializers.Serializer):
    period_start = serializers.DateTimeField()
    period_end = serializers.DateTimeField(allow_null=True)
    spent_usd = UsdField(source="spent_nano")
    reserved_usd = UsdField(source="reserved_nano")
    remaining_usd = UsdField(source="remaining_nano", min_value=None)  # below 0 when excess was billed
    percent_used = serializers.DecimalField(max_digits=12, decimal_places=2)


# A threshold's one message, however it is wrong (not a number, 0, 5000).
THRESHOLD_MESSAGE = "Whole percentages from 1 to 1000, e.g. 50, 80, 100."


class BudgetSerializer(serializers.ModelSerializer):
    scope = choice_field("Scope", Budget.Scope.choices)
    period = choice_field("Period", Budget.Period.choices, required=False)
    mode = choice_field("Mode", Budget.Mode.choices, required=False)
    amount_usd = UsdField(source="amount_nano")
    project = OrgRelatedField(
        org_path="organization", by="slug", queryset=Project.objects.all(), required=False, allow_null=True
    )
    member = OrgRelatedField(org_path="organization", queryset=Member.objects.all(), required=False, allow_null=True)
    api_key = OrgRelatedField(
        org_path="organization", by="name", queryset=ApiKey.objects.all(), required=False, allow_null=True
    )
    end_customer = EndCustomerRefField(queryset=EndCustomer.objects.all(), required=False, allow_null=True)
    run_id = serializers.CharField(max_length=200, required=False, allow_null=True)
    timezone = serializers.CharField(max_length=64, required=False)
    thresholds = serializers.ListField(
        child=WholeNumberField(
            min_value=1,
            max_value=1000,
            error_messages={
                "invalid": THRESHOLD_MESSAGE,
                "min_value": THRESHOLD_MESSAGE,
                "max_value": THRESHOLD_MESSAGE,
            },
        ),
        required=False,
        max_length=20,
    )
    recipients = serializers.ListField(child=EmailAddressField(), required=False, max_length=50)
    current = serializers.SerializerMethodField()

    class Meta:
        model = Budget
        fields = [
            "id",
            "name",
            "scope",
            "project",
            "member",
            "api_key",
            "end_customer",
            "run_id",
            "period",
            "timezone",
            "mode",
            "amount_usd",
            "thresholds",
            "recipients",
            "current",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]
        validators: list = []

    @extend_schema_field(WindowStatusSerializer(allow_null=True))
    def get_current(self, budget: Budget):
        return WindowStatusSerializer(current_status(budget=budget, now=timezone.now())).data


_SCOPE_FILTER = OpenApiParameter("scope", OpenApiTypes.STR, enum=Budget.Scope.values)


@extend_schema_view(list=extend_schema(parameters=[_SCOPE_FILTER]))
class BudgetViewSet(OrgCrudViewSet):
    """Budgets of every scope. Scope and subject are fixed once created; `current` is the
    window of the period containing now (spent, reserved, remaining)."""

    model = Budget
    serializer_class = BudgetSerializer
    writes = Writes(
        instance="budget", create=services.create_budget, update=services.update_budget, delete=services.delete_budget
    )

    def org_queryset(self):
        qs = super().org_queryset()
        scope = self.request.query_params.get("scope")
        return qs.filter(scope=scope) if scope else qs

    def update_kwargs(self, instance, data):
        if "scope" in data and data["scope"] == instance.scope:
            del data["scope"]  # scope is fixed once created: restating it is no change
        return data


# --- reservations --------------------------------------------------------------------------------


class ReservationSerializer(serializers.ModelSerializer):
    amount_usd = UsdField(source="amount_nano", read_only=True)

    class Meta:
        model = Reservation
        fields = [
            "id",
            "request_id",
            "project",
            "member",
            "api_key",
            "end_customer",
            "run_id",
            "model",
            "amount_usd",
            "created_at",
            "expires_at",
            "deadline_at",
            "job_id",
        ]
        read_only_fields = fields


@extend_schema(description="Live reservations: worst cases held on budgets until their usage is applied.")
class ReservationViewSet(OrgReadViewSet):
    model = Reservation
    ordering = ("-created_at", "id")
    serializer_class = ReservationSerializer
    lookup_value_regex = r"[0-9a-fA-F-]{36}"
