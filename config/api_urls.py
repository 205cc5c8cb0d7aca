"""/api/: the management API. Every resource lives under its organization:
/api/orgs/{org_slug}/<resource>/ — an outsider gets 404 for all of it."""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import SimpleRouter

from alerts.alert_api import AlertChannelViewSet, AlertDeliveryViewSet, AlertSettingsViewSet
from alerts.api import AlertEventViewSet, UsageViewSet
from budgets.api import BudgetViewSet, OrganizationViewSet, ProjectViewSet, ReservationViewSet
from catalog.api import ConnectionViewSet, PriceViewSet, RouteViewSet
from catalog.classification_api import ClassificationViewSet
from jobs.api import JobViewSet
from ratelimits.api import RateLimitViewSet
from requestlog.api import RequestLogViewSet
from tenants.api.views import EndCustomerViewSet, KeyViewSet, MemberViewSet

ORG = r"orgs/(?P<org_slug>[-a-zA-Z0-9_]+)"

router = SimpleRouter()
router.register(r"orgs", OrganizationViewSet, basename="organization")
# The deployment's, not an organization's: staff only.
router.register(r"classifications", ClassificationViewSet, basename="classification")
for prefix, viewset in [
    ("projects", ProjectViewSet),
    ("members", MemberViewSet),
    ("keys", KeyViewSet),
    ("end-customers", EndCustomerViewSet),
    ("budgets", BudgetViewSet),
    ("rate-limits", RateLimitViewSet),
    ("connections", ConnectionViewSet),
    ("routes", RouteViewSet),
    ("prices", PriceViewSet),
    ("usage", UsageViewSet),
    ("requests", RequestLogViewSet),
    ("reservations", ReservationViewSet),
    ("jobs", JobViewSet),
    ("alerts", AlertEventViewSet),
    ("alert-channels", AlertChannelViewSet),
    ("alert-deliveries", AlertDeliveryViewSet),
    ("alert-settings", AlertSettingsViewSet),
]:
    router.register(f"{ORG}/{prefix}", viewset, basename=prefix.rstrip("s").replace("-", "_"))

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    *router.urls,
]
