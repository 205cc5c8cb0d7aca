from django.apps import AppConfig


class CapcheckConfig(AppConfig):
    name = "capcheck"
