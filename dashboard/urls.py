from django.urls import path

from dashboard.views import alerting, catalog, live, manage, org, overview, ratelimits, records, requests

app_name = "dashboard"

ORG = "o/<slug:slug>/"

urlpatterns = [
    path("", overview.home, name="home"),
    path("switch/", overview.switch, name="switch"),
    path("htmx.js", live.htmx_js, name="htmx_js"),
    path(ORG, overview.overview, name="overview"),
    path(ORG + "reservations/", live.reservations, name="reservations"),
    path(ORG + "budgets/", manage.budgets, name="budgets"),
    path(ORG + "budgets/new/", manage.budget_new, name="budget_new"),
    path(ORG + "budgets/<int:pk>/", manage.budget_edit, name="budget_edit"),
    path(ORG + "budgets/<int:pk>/delete/", manage.budget_delete, name="budget_delete"),
    path(ORG + "rate-limits/", ratelimits.rate_limits, name="rate_limits"),
    path(ORG + "rate-limits/new/", ratelimits.rate_limit_new, name="rate_limit_new"),
    path(ORG + "rate-limits/<int:pk>/", ratelimits.rate_limit_edit, name="rate_limit_edit"),
    path(ORG + "rate-limits/<int:pk>/delete/", ratelimits.rate_limit_delete, name="rate_limit_delete"),
    path(ORG + "keys/", manage.keys, name="keys"),
    path(ORG + "keys/<int:pk>/revoke/", manage.key_revoke, name="key_revoke"),
    path(ORG + "projects/", manage.projects, name="projects"),
    path(ORG + "projects/<int:pk>/", manage.project_edit, name="project_edit"),
    path(ORG + "customers/<int:pk>/delete/", manage.customer_delete, name="customer_delete"),
    path(ORG + "members/", org.members, name="members"),
    path(ORG + "members/<int:pk>/role/", org.member_role, name="member_role"),
    path(ORG + "members/<int:pk>/remove/", org.member_remove, name="member_remove"),
    path(ORG + "connections/", org.connections, name="connections"),
    path(ORG + "connections/new/", org.connection_edit, name="connection_new"),
    path(ORG + "connections/<int:pk>/", org.connection_edit, name="connection_edit"),
    path(ORG + "connections/<int:pk>/delete/", org.connection_delete, name="connection_delete"),
    path(ORG + "routes/new/", catalog.route_edit, name="route_new"),
    path(ORG + "routes/<int:pk>/", catalog.route_edit, name="route_edit"),
    path(ORG + "routes/<int:pk>/delete/", catalog.route_delete, name="route_delete"),
    path(ORG + "prices/new/", catalog.price_edit, name="price_new"),
    path(ORG + "prices/<int:pk>/", catalog.price_edit, name="price_edit"),
    path(ORG + "tokens/", org.tokens, name="tokens"),
    path(ORG + "tokens/<int:pk>/revoke/", org.token_revoke, name="token_revoke"),
    path(ORG + "usage/", records.usage, name="usage"),
    path(ORG + "usage.csv", records.usage_csv, name="usage_csv"),
    path(ORG + "requests/", requests.requests, name="requests"),
    path(ORG + "requests.csv", requests.requests_csv, name="requests_csv"),
    path(ORG + "requests/<str:request_id>/", requests.request_detail, name="request_detail"),
    path(ORG + "alerts/", records.alerts, name="alerts"),
    path(ORG + "alert-channels/", alerting.alert_channels, name="alert_channels"),
    path(ORG + "alert-channels/new/", alerting.alert_channel_edit, name="alert_channel_new"),
    path(ORG + "alert-channels/<int:pk>/", alerting.alert_channel_edit, name="alert_channel_edit"),
    path(ORG + "alert-channels/<int:pk>/delete/", alerting.alert_channel_delete, name="alert_channel_delete"),
    path(ORG + "audit/", records.audit, name="audit"),
]
