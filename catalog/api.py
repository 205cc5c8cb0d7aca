"""Management API: connections (secrets write-only), routes, and the price catalog (read)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from catalog import services
from catalog.fields import UsdField as UsdField  # re-exported: the other apps' read-only USD fields
from catalog.fields import rate_field
from catalog.models import Connection, Model, Route
from core.errors import InvalidChange
from tenants.api.base import OrgCrudViewSet, OrgReadViewSet, Writes
from tenants.api.fields import choice_field, output_ceiling_field
from tenants.api.refs import OrgRelatedField


class ConnectionSerializer(serializers.ModelSerializer):
    secret = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=10_000,
        trim_whitespace=False,
        help_text="Write-only: stored encrypted, never returned.",
    )
    has_secret = serializers.SerializerMethodField()
    kind = choice_field("Kind", Connection.Kind.choices)
    base_url = serializers.URLField(required=False, allow_blank=True, max_length=200)
    input_usd_per_mtok = rate_field()
    output_usd_per_mtok = rate_field()
    cache_read_usd_per_mtok = rate_field()
    cache_write_usd_per_mtok = rate_field()
    options = serializers.DictField(required=False)

    class Meta:
        model = Connection
        fields = [
            "id",
            "name",
            "kind",
            "base_url",
            "secret",
            "has_secret",
            *services.RATE_FIELDS,
            "options",
            "enabled",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]
        validators: list = []  # name uniqueness is the service's to report, as a field error

    def get_has_secret(self, connection: Connection) -> bool:
        return bool(connection.secret)


class ConnectionViewSet(OrgCrudViewSet):
    """An organization's upstreams. Rates set here override the catalog's list price for it."""

    model = Connection
    serializer_class = ConnectionSerializer
    writes = Writes(
        instance="connection",
        create=services.create_connection,
        update=services.update_connection,
        delete=services.delete_connection,
    )

    def update_kwargs(self, instance, data):
        return {**data, "secret": data.get("secret")}  # absent (None): keep the stored secret


class ModelRefField(serializers.CharField):
    def to_internal_value(self, data) -> Model:  # type: ignore[override]
        try:
            return services.find_model(super().to_internal_value(data))
        except InvalidChange as exc:  # a field error, named by its place in the list
            raise serializers.ValidationError(exc.message) from exc

    def to_representation(self, value) -> str:
        return str(value)


class RouteTargetSerializer(serializers.Serializer):
    connection = OrgRelatedField(org_path="organization", by="name", queryset=Connection.objects.all())
    model = ModelRefField(help_text="provider/model, as in the catalog")


class RouteSerializer(serializers.ModelSerializer):
    targets = RouteTargetSerializer(many=True, help_text="Tried in order (failover).")
    name = serializers.CharField(max_length=200)
    default_max_output_tokens = output_ceiling_field(
        help_text="Output ceiling sent upstream when a request names none (the tighter of this and the key's)."
    )

    class Meta:
        model = Route
        fields = ["id", "name", "targets", "default_max_output_tokens"]
        read_only_fields = ["id"]
        validators: list = []

    def to_representation(self, route: Route):
        return {
            "id": route.id,
            "name": route.name,
            "default_max_output_tokens": route.default_max_output_tokens,
            "targets": [
                {"connection": t.connection_id, "model": str(t.model)}
                for t in route.targets.select_related("model__provider").order_by("position")
            ],
        }


class RouteViewSet(OrgCrudViewSet):
    """A model name the organization's keys call, mapped to ordered (connection, model) targets."""

    model = Route
    serializer_class = RouteSerializer
    writes = Writes(instance="route", delete=services.delete_route)

    def _set(self, serializer, name: str):
        data = serializer.validated_data
        route = serializer.instance
        if "targets" in data:
            targets = [(t["connection"], t["model"]) for t in data["targets"]]
        else:
            targets = [(t.connection, t.model) for t in route.targets.select_related("connection", "model")]
        route, _ = services.set_route(
            organization=self.organization,
            name=name,
            targets=targets,
            actor=self.access.actor,
            default_max_output_tokens=data.get("default_max_output_tokens", services.KEEP),
        )
        serializer.instance = route

    def perform_create(self, serializer):
        name = serializer.validated_data["name"]
        if self.organization.routes.filter(name=name).exists():
            raise InvalidChange(f"A route named {name!r} exists.", param="name")
        self._set(serializer, name)

    def perform_update(self, serializer):
        if not {"targets", "default_max_output_tokens"} & set(serializer.validated_data):
            return
        self._set(serializer, serializer.instance.name)


class PriceSerializer(serializers.ModelSerializer):
    model = serializers.SerializerMethodField()
    priced = serializers.BooleanField(source="is_priced", read_only=True)

    class Meta:
        model = Model
        fields = [
            "id",
            "model",
            *services.RATE_FIELDS,
            "per_request_usd",
            *services.FEATURE_DECIMAL_FIELDS,
            *services.FEATURE_INT_FIELDS,
            "max_output_tokens",
            "context_window",
            "max_image_tokens",
            "tokenizer",
            "price_tiers",
            "batch_multiplier",
            "prices_as_of",
            "priced",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField())
    def get_model(self, model: Model) -> str:
        return str(model)


class PriceViewSet(OrgReadViewSet):
    """The list-price catalog (read-only; negotiated rates live on connections)."""

    model = Model
    serializer_class = PriceSerializer

    def org_queryset(self):
        # Global rows: every organization prices with them, once its membership is checked (404 else).
        self.access  # noqa: B018
        return Model.objects.select_related("provider").order_by("provider__slug", "name")
