from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "tenants"
    verbose_name = "Tenants and quotas"

    def ready(self) -> None:
        from tenants import lookups  # noqa: F401  registers ``__among`` on every field
