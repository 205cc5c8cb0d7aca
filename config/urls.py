from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/", include("gateway.urls")),
    path("api/", include("config.api_urls")),
    path("", include("config.dashboard_urls")),
]
