from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from tenants.models import Tenant

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
# Docker reference grammar for a repository path, optionally with a registry host[:port].
REPOSITORY_PATTERN = (
    r"^([a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?/)?"
    r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$"
)

digest_validator = RegexValidator(
    DIGEST_PATTERN, "A digest is 'sha256:' followed by 64 lowercase hex characters."
)
repository_validator = RegexValidator(
    REPOSITORY_PATTERN, "Not a valid repository name, e.g. registry.example.org/team/pytorch."
)


class Image(models.Model):
    """A container image, always identified by its content digest."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending review"
        APPROVED = "approved", "Approved"
        BLOCKED = "blocked", "Blocked"

    repository = models.CharField(max_length=255, validators=[repository_validator])
    digest = models.CharField(max_length=71, validators=[digest_validator])
    tag = models.CharField(max_length=128, blank=True, help_text="Tag last seen for the digest")
    description = models.CharField(max_length=255, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    visible_to_all = models.BooleanField(default=True)
    allowed_tenants = models.ManyToManyField(Tenant, blank=True, related_name="allowed_images")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["repository", "tag"]
        constraints = [
            models.UniqueConstraint(fields=["repository", "digest"], name="image_unique_digest"),
            models.CheckConstraint(condition=Q(digest__regex=DIGEST_PATTERN), name="image_digest"),
        ]

    def __str__(self) -> str:
        return f"{self.repository}:{self.tag}" if self.tag else self.reference

    @property
    def reference(self) -> str:
        """What a backend receives: always pinned by digest."""
        return f"{self.repository}@{self.digest}"
