from django.apps import AppConfig


class EchoConfig(AppConfig):
    name = "echo"
