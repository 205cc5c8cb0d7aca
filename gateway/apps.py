from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"

    def ready(self) -> None:
        from gateway import echo  # noqa: F401 — registers the built-in provider's connection kind
        from gateway.dbthreads import reconnect_steadily

        reconnect_steadily()
