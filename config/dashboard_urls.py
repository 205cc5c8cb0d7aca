"""The web dashboard: accounts (login, logout, password reset by email) and per-organization pages."""

from django.urls import include, path

urlpatterns = [
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("dashboard.urls")),
]
