"""/api/classifications/: the deployment operator's classifications of what the billing
inventory does not list (catalog/classifications.py). Staff only (a logged-in user with
is_staff); an organization's owner or API token gets 403: a classification decides what every
blocking cap sees."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, serializers, viewsets
from rest_framework.permissions import BasePermission

from catalog.classifications import ENDPOINTS, classify
from catalog.models import Classification
from tenants.api.fields import choice_field
from tenants.audit import Actor
from tenants.models import ApiToken, Organization


class IsOperator(BasePermission):
    message = "Only the deployment's operator (a staff user) classifies the billing inventory."

    def has_permission(self, request, view) -> bool:
        if isinstance(request.auth, ApiToken):  # an organization's token: never the operator
            return False
        if not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        return bool(request.user.is_staff)


class ClassificationSerializer(serializers.ModelSerializer):
    organization = serializers.SlugRelatedField(
        slug_field="slug",
        queryset=Organization.objects.all(),
        required=False,
        allow_null=True,
        help_text="An organization's slug, or null: the whole deployment.",
    )
    endpoint = choice_field("Endpoint", [(e, e) for e in ENDPOINTS])
    what = choice_field("What", Classification.What.choices)
    cls = choice_field("Class", Classification.Cls.choices)

    class Meta:
        model = Classification
        fields = ["id", "organization", "endpoint", "what", "name", "cls", "reason", "updated_by", "updated_at"]
        read_only_fields = ["id", "updated_by", "updated_at"]
        validators: list = []  # one row per scope and name: classify() updates it


@extend_schema(tags=["classifications"])
class ClassificationViewSet(viewsets.GenericViewSet, mixins.ListModelMixin, mixins.CreateModelMixin):
    """List the classifications, or set one (POST creates it, or changes the class and reason
    of the one with the same organization, endpoint, what and name)."""

    serializer_class = ClassificationSerializer
    permission_classes = [IsOperator]

    def get_queryset(self):
        return Classification.objects.select_related("organization").order_by("endpoint", "what", "name", "id")

    def perform_create(self, serializer):
        user = self.request.user
        data = serializer.validated_data
        serializer.instance = classify(
            actor=Actor(label=user.email or user.get_username(), user_id=user.pk, operator=True),
            organization=data.get("organization"),
            endpoint=data["endpoint"],
            what=data["what"],
            name=data["name"],
            cls=data["cls"],
            reason=data["reason"],
        )
