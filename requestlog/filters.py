"""The request log's filters, declared once: the API applies them through django-filter's DRF
backend (so they are documented in /api/schema/), the dashboard renders the same FilterSet's
form. Project and key choices are limited to the caller's organization."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet

from requestlog.models import RequestLogEntry
from requestlog.pages import customer_ids
from tenants.models import ApiKey, Organization, Project


class RequestLogFilter(django_filters.FilterSet):
    request_id = django_filters.CharFilter(max_length=100, help_text="exactly this request id (x-capgate-request-id)")
    customer = django_filters.CharFilter(
        method="filter_customer",
        max_length=200,
        label="Customer",
        help_text="the end customer's id (X-Capgate-Customer)",
    )
    run = django_filters.CharFilter(
        field_name="run_id", max_length=200, label="Run", help_text="the run id (X-Capgate-Run)"
    )
    status = django_filters.ChoiceFilter(choices=RequestLogEntry.Status.choices)
    code = django_filters.CharFilter(max_length=100, help_text="the refusal's error code, e.g. organization_budget")
    model = django_filters.CharFilter(max_length=200, help_text="the model the caller asked for")
    project = django_filters.ModelChoiceFilter(queryset=Project.objects.none())
    api_key = django_filters.ModelChoiceFilter(queryset=ApiKey.objects.none(), label="Key")
    since = django_filters.IsoDateTimeFilter(
        field_name="at", lookup_expr="gte", label="Since", help_text="at or after (ISO 8601)"
    )
    until = django_filters.IsoDateTimeFilter(
        field_name="at", lookup_expr="lt", label="Until", help_text="before (ISO 8601)"
    )

    class Meta:
        model = RequestLogEntry
        fields = ["request_id", "customer", "run", "status", "code", "model", "project", "api_key", "since", "until"]

    def __init__(
        self,
        data: Any = None,
        queryset: QuerySet | None = None,
        *,
        request: Any = None,
        prefix: str | None = None,
        organization: Organization | None = None,
    ):
        super().__init__(data, queryset, request=request, prefix=prefix)
        self.organization = organization
        if organization is not None:
            self.filters["project"].queryset = Project.objects.filter(organization=organization).order_by("slug")
            self.filters["api_key"].queryset = ApiKey.objects.filter(organization=organization).order_by("name")

    def filter_customer(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        """By the customers' ids, looked up first (one per project at most), so the log reads
        the (end customer, time) indexes instead of joining the customers table."""
        if self.organization is None:
            return queryset.none()
        return queryset.filter(end_customer_id__in=customer_ids(organization=self.organization, external_id=value))
