from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The operator's surfaces over every app: the web dashboard and `manage.py apply`.

    It sits above usage in the import order (like gateway), so it may read and write them all.
    """

    name = "dashboard"
    default_auto_field = "django.db.models.BigAutoField"
