from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self) -> None:
        # The gateway serves /v1/*; the job endpoints live here, above it, and are registered in
        # its route table (and its background-response hand-off) once the apps are loaded.
        # Imported in ready(): jobs.http imports models, which need the app registry.
        from jobs import http

        http.install()
