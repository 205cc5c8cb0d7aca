"""Management API: an organization's alert channels, their webhook deliveries, and its alert
settings. Under /api/orgs/{slug}/: an outsider gets 404 for all of it."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.response import Response

from alerts import channels
from alerts.alert_models import AlertChannel, AlertDelivery
from tenants.api.base import OrgCrudViewSet, OrgReadViewSet, OrgViewSet, Writes
from tenants.api.fields import choice_field


class AlertChannelSerializer(serializers.ModelSerializer):
    kind = choice_field("Kind", AlertChannel.Kind.choices)
    payload_format = choice_field("Payload format", AlertChannel.Format.choices, required=False)
    emails = serializers.ListField(
        child=serializers.CharField(max_length=254), required=False, max_length=channels.MAX_EMAILS
    )
    url = serializers.CharField(required=False, allow_blank=True, max_length=500)
    secret = serializers.SerializerMethodField(
        help_text="The webhook's signing secret: only in the response that created or rotated it."
    )

    class Meta:
        model = AlertChannel
        fields = ["id", "name", "kind", "emails", "url", "payload_format", "enabled", "created_at", "secret"]
        read_only_fields = ["id", "created_at", "secret"]

    def get_secret(self, obj) -> str | None:
        return self.context.get("new_secret")


class AlertChannelUpdateSerializer(AlertChannelSerializer):
    rotate_secret = serializers.BooleanField(required=False, default=False, write_only=True)

    class Meta(AlertChannelSerializer.Meta):
        fields = [*AlertChannelSerializer.Meta.fields, "rotate_secret"]
        read_only_fields = ["id", "created_at", "secret", "kind"]


class AlertChannelViewSet(OrgCrudViewSet):
    """Where alerts go besides each budget's recipients: email addresses, or signed webhooks
    (HMAC-SHA256 of `<X-Capgate-Timestamp>.<body>` in `X-Capgate-Signature`)."""

    model = AlertChannel
    writes = Writes(instance="channel", delete=channels.delete_channel)

    def get_serializer_class(self):
        return AlertChannelUpdateSerializer if self.action in ("update", "partial_update") else AlertChannelSerializer

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        channel, secret = channels.create_channel(
            organization=self.organization, actor=self.access.actor, **serializer.validated_data
        )
        data = AlertChannelSerializer(channel, context={"new_secret": secret or None}).data
        return Response(data, status=status.HTTP_201_CREATED)

    def update(self, request, *args, **kwargs):
        channel = self.get_object()
        serializer = self.get_serializer(channel, data=request.data, partial=kwargs.get("partial", False))
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        _changes, secret = channels.update_channel(
            channel=channel, actor=self.access.actor, rotate_secret=data.pop("rotate_secret", False), **data
        )
        channel.refresh_from_db()
        return Response(AlertChannelSerializer(channel, context={"new_secret": secret or None}).data)


class AlertDeliverySerializer(serializers.ModelSerializer):
    channel_name = serializers.CharField(source="channel.name", read_only=True)

    class Meta:
        model = AlertDelivery
        fields = [
            "id",
            "event",
            "channel",
            "channel_name",
            "status",
            "attempts",
            "response_status",
            "last_error",
            "created_at",
            "next_attempt_at",
            "sent_at",
        ]
        read_only_fields = fields


class AlertDeliveryViewSet(OrgReadViewSet):
    """The webhook delivery log: every alert sent to every webhook channel, with its attempts."""

    model = AlertDelivery
    ordering = ("-created_at", "-id")
    serializer_class = AlertDeliverySerializer

    def can_write(self, access) -> bool:
        return False

    def org_queryset(self):
        return super().org_queryset().select_related("channel")


class AlertSettingsSerializer(serializers.Serializer):
    alert_run_budgets = serializers.BooleanField(
        help_text="Send alerts for per-run budgets (X-Capgate-Run). Off by default: they are enforced, not emailed."
    )


class AlertSettingsViewSet(OrgViewSet):
    """The organization's alert settings (one object)."""

    serializer_class = AlertSettingsSerializer

    @extend_schema(responses=AlertSettingsSerializer)
    @action(detail=False, methods=["get"], url_path="current")
    def current(self, request, *args, **kwargs):
        return Response(AlertSettingsSerializer(channels.alert_settings(organization=self.organization)).data)

    @extend_schema(request=AlertSettingsSerializer, responses=AlertSettingsSerializer)
    @current.mapping.put
    def put(self, request, *args, **kwargs):
        data = AlertSettingsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        saved = channels.set_alert_settings(
            organization=self.organization,
            actor=self.access.actor,
            alert_run_budgets=data.validated_data["alert_run_budgets"],
        )
        return Response(AlertSettingsSerializer(saved).data)
