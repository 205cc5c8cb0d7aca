from django.apps import AppConfig


class RatelimitsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "ratelimits"
