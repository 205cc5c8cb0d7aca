from django.apps import AppConfig


class EchoConfig(AppConfig):
    name = "echo"

    def ready(self) -> None:
        # Chosen by connection kind like any provider: routing and the request path ask its
        # adapter (the endpoints it serves), and the gateway's upstream client hands every call on
        # an "echo" connection to this transport, which answers in-process. Imported in ready():
        # these import models, which need the app registry.
        from echo.provider import Echo
        from echo.transport import EchoTransport
        from gateway import providers
        from gateway.upstream import transport

        providers.register("echo", Echo())
        transport.register("echo", EchoTransport())
