from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Experiments and runs"

    def ready(self) -> None:
        # Register the tasks in every process: jobs.enqueue sends them by name.
        from jobs import tasks  # noqa: F401
