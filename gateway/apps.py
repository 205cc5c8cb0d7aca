from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"

    def ready(self) -> None:
        # Imported in ready(): an app's config module is loaded before the app registry is.
        from gateway.upstream.dbthreads import reconnect_steadily

        reconnect_steadily()
