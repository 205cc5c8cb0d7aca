from django.apps import AppConfig


class RequestLogConfig(AppConfig):
    name = "requestlog"
    verbose_name = "Request log"
