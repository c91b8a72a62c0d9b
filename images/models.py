from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from tenants.models import Tenant, slug_validator

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
# Docker reference grammar for a repository path, optionally with a registry host[:port].
REPOSITORY_PATTERN = (
    r"^([a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?/)?"
    r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$"
)
# The host part of REPOSITORY_PATTERN: what a registry's URL may name so image names can carry it.
REGISTRY_HOST_PATTERN = r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?$"
REGISTRY_URL_PATTERN = r"^https?://"
# The name of an environment variable, as conventionally written: never the secret itself.
SECRET_REF_PATTERN = r"^[A-Z_][A-Z0-9_]{0,127}$"  # noqa: S105 (a pattern, not a password)
MAX_REGISTRY_TIMEOUT_S = 120

digest_validator = RegexValidator(
    DIGEST_PATTERN, "A digest is 'sha256:' followed by 64 lowercase hex characters."
)
repository_validator = RegexValidator(
    REPOSITORY_PATTERN, "Not a valid repository name, e.g. registry.example.org/team/pytorch."
)
secret_ref_validator = RegexValidator(
    SECRET_REF_PATTERN,
    "The name of an environment variable: capital letters, digits and '_', e.g. "
    "GANTRY_REGISTRY_PASSWORD. Never the password itself.",
)


class Registry(models.Model):
    """An OCI registry images are imported from. Credentials are held by reference only:
    `password_secret_ref` names an environment variable that is read when the registry is
    called, so no secret is ever stored, shown or audited."""

    class AuthKind(models.TextChoices):
        ANONYMOUS = "anonymous", "Anonymous"
        BASIC = "basic", "Basic (username and password)"
        TOKEN = "token", "Bearer token (token server, optionally with a username and password)"

    name = models.SlugField(max_length=63, unique=True, validators=[slug_validator])
    url = models.CharField(max_length=255, help_text="e.g. https://registry.example.org")
    # The URL's host[:port], lowercased: image names start with it (host/path).
    host = models.CharField(max_length=255, unique=True, editable=False)
    auth_kind = models.CharField(
        max_length=10, choices=AuthKind.choices, default=AuthKind.ANONYMOUS
    )
    username = models.CharField(max_length=150, blank=True)
    password_secret_ref = models.CharField(
        max_length=128, blank=True, validators=[secret_ref_validator]
    )
    ca_bundle_path = models.CharField(max_length=1024, blank=True)
    timeout_s = models.PositiveSmallIntegerField(
        default=10, validators=[MinValueValidator(1), MaxValueValidator(MAX_REGISTRY_TIMEOUT_S)]
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "registries"
        constraints = [
            models.CheckConstraint(
                condition=Q(url__regex=REGISTRY_URL_PATTERN), name="registry_url_http"
            ),
            models.CheckConstraint(
                condition=Q(password_secret_ref="")
                | Q(password_secret_ref__regex=SECRET_REF_PATTERN),
                name="registry_secret_ref_is_a_name",
            ),
            models.CheckConstraint(
                condition=Q(timeout_s__gte=1, timeout_s__lte=MAX_REGISTRY_TIMEOUT_S),
                name="registry_timeout_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Image(models.Model):
    """A container image, always identified by its content digest."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending review"
        APPROVED = "approved", "Approved"
        BLOCKED = "blocked", "Blocked"

    class CheckStatus(models.TextChoices):
        UNCHECKED = "", "Not checked"
        OK = "ok", "OK"
        MOVED = "moved", "Tag moved"
        MISSING = "missing", "Digest missing"
        ERROR = "error", "Check failed"

    # Null for images recorded before registries were: their repository still names the host.
    registry = models.ForeignKey(
        Registry, null=True, blank=True, on_delete=models.PROTECT, related_name="images"
    )
    # The full name a backend pulls: the registry's host, then the path inside the registry.
    repository = models.CharField(max_length=255, validators=[repository_validator])
    digest = models.CharField(max_length=71, validators=[digest_validator])
    tag = models.CharField(max_length=128, blank=True, help_text="Tag last seen for the digest")
    description = models.CharField(max_length=255, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    visible_to_all = models.BooleanField(default=True)
    allowed_tenants = models.ManyToManyField(Tenant, blank=True, related_name="allowed_images")
    media_type = models.CharField(max_length=100, blank=True)
    architecture = models.CharField(max_length=32, blank=True)
    os = models.CharField(max_length=32, blank=True)
    created = models.DateTimeField(null=True, blank=True, help_text="When the image was built")
    size_bytes = models.BigIntegerField(null=True, blank=True, help_text="Config and layers")
    cuda_version = models.CharField(max_length=64, blank=True)
    nccl_version = models.CharField(max_length=64, blank=True)
    frameworks = models.JSONField(default=dict, blank=True)  # e.g. {"pytorch": "2.3.1"}
    last_checked_at = models.DateTimeField(null=True, blank=True)
    check_status = models.CharField(
        max_length=10, choices=CheckStatus.choices, default=CheckStatus.UNCHECKED, blank=True
    )
    check_message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["repository", "tag"]
        constraints = [
            models.UniqueConstraint(fields=["repository", "digest"], name="image_unique_digest"),
            models.CheckConstraint(condition=Q(digest__regex=DIGEST_PATTERN), name="image_digest"),
        ]
        indexes = [models.Index(fields=["status", "repository"], name="image_status_repository")]

    def __str__(self) -> str:
        return f"{self.repository}:{self.tag}" if self.tag else self.reference

    @property
    def reference(self) -> str:
        """What a backend receives: always pinned by digest."""
        return f"{self.repository}@{self.digest}"

    @property
    def registry_path(self) -> str:
        """The repository inside its registry (without the host), or "" if it has none."""
        if self.registry is None or not self.repository.startswith(f"{self.registry.host}/"):
            return ""
        return self.repository[len(self.registry.host) + 1 :]

    @property
    def oci_labels(self) -> dict:
        return {k: v for k, v in self.labels.items() if k.startswith("org.opencontainers.image.")}
