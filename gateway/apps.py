from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"

    def ready(self) -> None:
        from gateway.upstream.dbthreads import reconnect_steadily

        reconnect_steadily()
