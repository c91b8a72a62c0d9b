from django.apps import AppConfig


class PolicyConfig(AppConfig):
    name = "policy"
    verbose_name = "Policy what-if"

    def ready(self) -> None:
        # Register the tasks in every process: the services send them by name.
        from policy import tasks  # noqa: F401
