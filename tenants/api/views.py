"""Management API endpoints for members, gateway keys and end customers (the shared base,
auth and error shape are tenants/api/base.py and auth.py).

URL shape: /api/orgs/{org_slug}/<resource>/. Views parse, call one service, render.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, serializers, status
from rest_framework.response import Response

from core.strict import ascii_int
from tenants import services
from tenants.api.base import OrgCrudViewSet, OrgReadViewSet, Writes
from tenants.api.base import OrgViewSet as OrgViewSet  # also exported beside the resources built on it
from tenants.api.fields import choice_field, output_ceiling_field
from tenants.api.refs import OrgRelatedField
from tenants.members import add_member, change_member_role, remove_member
from tenants.models import ApiKey, EndCustomer, Member, Project
from tenants.selectors import Access


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.api.auth.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Organization API token (cgt_…)"}


# --- members -------------------------------------------------------------------------------------


class MemberSerializer(serializers.ModelSerializer):
    email = serializers.EmailField(source="user.email")
    role = choice_field("Role", Member.Role.choices, required=False)

    class Meta:
        model = Member
        fields = ["id", "email", "role", "created_at"]
        read_only_fields = ["id", "created_at"]


class MemberRoleSerializer(serializers.Serializer):
    role = choice_field("Role", Member.Role.choices)


@extend_schema_view(
    partial_update=extend_schema(request=MemberRoleSerializer, responses=MemberSerializer),
    update=extend_schema(request=MemberRoleSerializer, responses=MemberSerializer),
)
class MemberViewSet(OrgCrudViewSet):
    model = Member
    serializer_class = MemberSerializer
    writes = Writes(instance="member", create=add_member, delete=remove_member)

    def org_queryset(self):
        return super().org_queryset().select_related("user")

    def create_kwargs(self, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "organization": self.organization,
            "email": data["user"]["email"],
            "role": data.get("role", Member.Role.MEMBER),
        }

    def update(self, request, *args, **kwargs):
        member = self.get_object()
        data = MemberRoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        change_member_role(member=member, role=data.validated_data["role"], actor=self.access.actor)
        return Response(MemberSerializer(member).data)


# --- gateway keys --------------------------------------------------------------------------------


class KeySerializer(serializers.ModelSerializer):
    project = OrgRelatedField(org_path="organization", by="slug", queryset=Project.objects.all())
    member = OrgRelatedField(org_path="organization", queryset=Member.objects.all(), required=False, allow_null=True)
    allowed_models = serializers.ListField(child=serializers.CharField(max_length=200), required=False, max_length=500)
    default_max_output_tokens = output_ceiling_field(
        help_text="Output ceiling sent upstream when a request names none (the tighter of this and the route's)."
    )
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "name",
            "prefix",
            "project",
            "member",
            "allowed_models",
            "default_max_output_tokens",
            "expires_at",
            "revoked_at",
            "active",
            "created_at",
        ]
        read_only_fields = ["id", "prefix", "revoked_at", "created_at"]

    def get_active(self, key: ApiKey) -> bool:
        return key.revoked_at is None and (key.expires_at is None or key.expires_at > timezone.now())


class KeyCreatedSerializer(KeySerializer):
    secret = serializers.CharField(read_only=True, help_text="Shown once; only its hash is stored.")

    class Meta(KeySerializer.Meta):
        fields = [*KeySerializer.Meta.fields, "secret"]


class KeyUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    allowed_models = serializers.ListField(child=serializers.CharField(max_length=200), required=False, max_length=500)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    default_max_output_tokens = output_ceiling_field(
        help_text="Output ceiling sent upstream when a request names none (the tighter of this and the route's)."
    )


@extend_schema_view(
    create=extend_schema(responses={201: KeyCreatedSerializer}),
    update=extend_schema(request=KeyUpdateSerializer, responses=KeySerializer),
    partial_update=extend_schema(request=KeyUpdateSerializer, responses=KeySerializer),
    destroy=extend_schema(description="Revoke the key (it stays listed, revoked)."),
)
class KeyViewSet(OrgReadViewSet):
    model = ApiKey
    serializer_class = KeySerializer

    def can_write(self, access: Access) -> bool:
        # Members manage their own keys (checked per key below); viewers and read tokens only read.
        return access.can_manage_own_keys

    def create(self, request, *args, **kwargs):
        data = KeySerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        v = data.validated_data
        member = v.get("member")
        if not self.access.can_manage:
            if member is not None and member != self.access.member:
                raise exceptions.PermissionDenied("Members create keys for themselves only.")
            member = self.access.member
        key, raw = services.create_key(
            organization=self.organization,
            project=v["project"],
            name=v["name"],
            member=member,
            allowed_models=v.get("allowed_models", []),
            expires_at=v.get("expires_at"),
            actor=self.access.actor,
            default_max_output_tokens=v.get("default_max_output_tokens"),
        )
        key.secret = raw  # type: ignore[attr-defined]
        return Response(
            KeyCreatedSerializer(key, context=self.get_serializer_context()).data, status=status.HTTP_201_CREATED
        )

    def _own(self) -> ApiKey:
        key = self.get_object()
        if not self.access.can_manage_key(key):
            raise exceptions.PermissionDenied("Members manage their own keys only.")
        return key

    def update(self, request, *args, **kwargs):
        key = self._own()
        data = KeyUpdateSerializer(data=request.data, partial=kwargs.get("partial", False))
        data.is_valid(raise_exception=True)
        services.update_key(key=key, actor=self.access.actor, **data.validated_data)
        return Response(KeySerializer(key, context=self.get_serializer_context()).data)

    def partial_update(self, request, *args, **kwargs):
        return self.update(request, *args, partial=True, **kwargs)

    def destroy(self, request, *args, **kwargs):
        services.revoke_key(key=self._own(), actor=self.access.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- end customers -------------------------------------------------------------------------------


class EndCustomerSerializer(serializers.ModelSerializer):
    project = OrgRelatedField(org_path="organization", by="slug", queryset=Project.objects.all())
    external_id = serializers.CharField(max_length=200)

    class Meta:
        model = EndCustomer
        fields = ["id", "project", "external_id", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators: list = []  # uniqueness is the service's to report, as a field error


@extend_schema_view(list=extend_schema(parameters=[OpenApiParameter("project", OpenApiTypes.INT)]))
class EndCustomerViewSet(OrgReadViewSet, mixins.CreateModelMixin, mixins.DestroyModelMixin):
    model = EndCustomer
    org_field = "project__organization"
    serializer_class = EndCustomerSerializer
    writes = Writes(instance="customer", create=services.create_end_customer, delete=services.delete_end_customer)

    def org_queryset(self):
        qs = super().org_queryset()
        project = self.request.query_params.get("project")
        if project:
            project_id = ascii_int(project)
            if project_id is None:
                raise exceptions.ValidationError({"project": ["A project id: ASCII digits only."]})
            qs = qs.filter(project_id=project_id)
        return qs

    def create_kwargs(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"project": data["project"], "external_id": data["external_id"]}  # the project names the org
