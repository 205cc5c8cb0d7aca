from django.apps import AppConfig


class EchoConfig(AppConfig):
    name = "echo"

    def ready(self) -> None:
        # Chosen by connection kind like any provider: the gateway's upstream client hands every
        # call on an "echo" connection to this transport, which answers in-process.
        from echo.transport import EchoTransport
        from gateway.upstream import transport

        transport.register("echo", EchoTransport())
