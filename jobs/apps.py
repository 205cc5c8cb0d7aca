from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self) -> None:
        # The gateway serves /v1/*; the job endpoints live here, above it, and are plugged into
        # its router (and its background-response hand-off) once the apps are loaded.
        from jobs import http

        http.install()
