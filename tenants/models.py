import hashlib
import secrets

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from tenants.queueing import QUEUEING_MAX_LENGTH, Queueing

slug_validator = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
    "Use 1-63 lowercase letters, digits and dashes, starting and ending with a letter or digit.",
)


def max_length_of(model: type[models.Model], field_name: str) -> int:
    """The ``max_length`` of a model's character field, for checks and truncation."""
    field = model._meta.get_field(field_name)
    if not isinstance(field, models.Field) or field.max_length is None:
        raise TypeError(f"{model.__name__}.{field_name} has no max_length")
    return field.max_length


def is_whole_number(value: object) -> bool:
    """An int and not a bool, which Python counts as one: what a count, a limit or a number
    of days given as JSON must be."""
    return isinstance(value, int) and not isinstance(value, bool)


# A queueing policy as a choice of a form field and a value of a column (its one definition:
# ``tenants.queueing``).
QUEUEING_CHOICES = [(policy.value, policy.value) for policy in Queueing]


# The longest idle streak an idle-GPU policy may wait for: a week, in minutes.
IDLE_POLICY_MAX_MIN = 7 * 24 * 60
# A workspace's idle threshold: from five minutes (shorter would suspend people who read a
# notebook for a moment) to a week; its longest life: a week.
WORKSPACE_IDLE_MIN_MIN = 5
WORKSPACE_IDLE_MAX_MIN = 7 * 24 * 60
WORKSPACE_MAX_HOURS = 7 * 24


class GlobalRole(models.TextChoices):
    """Roles that span tenants; held as Django groups of the same name."""

    PLATFORM_ADMIN = "platform_admin", "Platform admin"
    FINANCE = "finance", "Finance"


class Tenant(models.Model):
    slug = models.SlugField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    cost_center = models.CharField(max_length=64, blank=True)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Idle-GPU policy, in consecutive idle minutes of a running attempt (telemetry/idle.py);
    # None turns the step off. Off by default: cancelling is a tenant's decision.
    idle_notify_after_min = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(IDLE_POLICY_MAX_MIN)],
        help_text="Warn the submitter after this many idle minutes; empty: never",
    )
    idle_cancel_after_min = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(IDLE_POLICY_MAX_MIN)],
        help_text="Cancel the run after this many idle minutes; empty: never",
    )
    # Overrides the queueing policy of every cluster for this tenant's runs; set by platform
    # admins (the Django admin, audited as "tenant.update").
    queueing = models.CharField(
        max_length=QUEUEING_MAX_LENGTH,
        choices=QUEUEING_CHOICES,
        blank=True,
        help_text="What later runs do while the first in line cannot start: strict, backfill "
        "or best-effort (docs/admission.md, Backfill); empty: each cluster's policy",
    )

    # Interactive workspaces (docs/workspaces.md): idle on every signal (no busy kernel or
    # terminal, no connection through the proxy, no GPU activity) this long, a workspace is
    # suspended (its GPUs released, its files kept); its owner is warned before.
    workspace_suspend_after_min = models.PositiveIntegerField(
        default=60,
        validators=[
            MinValueValidator(WORKSPACE_IDLE_MIN_MIN),
            MaxValueValidator(WORKSPACE_IDLE_MAX_MIN),
        ],
        help_text="Suspend a workspace idle on every signal for this many minutes",
    )
    workspace_warn_before_min = models.PositiveIntegerField(
        default=10,
        validators=[MinValueValidator(1), MaxValueValidator(WORKSPACE_IDLE_MAX_MIN)],
        help_text="Warn its owner this many minutes before a workspace is suspended",
    )
    workspace_suspend_silent_busy = models.BooleanField(
        default=False,
        help_text="Also suspend a workspace whose kernel is busy without output while its "
        "GPUs are idle (off: such a workspace is only warned about)",
    )
    workspace_max_hours = models.PositiveIntegerField(
        default=12,
        validators=[MinValueValidator(1), MaxValueValidator(WORKSPACE_MAX_HOURS)],
        help_text="The longest a workspace may run, extensions included",
    )

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    workspace_suspend_after_min__gte=WORKSPACE_IDLE_MIN_MIN,
                    workspace_suspend_after_min__lte=WORKSPACE_IDLE_MAX_MIN,
                    workspace_warn_before_min__gte=1,
                    workspace_warn_before_min__lt=models.F("workspace_suspend_after_min"),
                    workspace_max_hours__gte=1,
                    workspace_max_hours__lte=WORKSPACE_MAX_HOURS,
                ),
                name="tenant_workspace_policy_range",
            ),
            models.CheckConstraint(
                condition=Q(queueing="") | Q(queueing__in=[policy.value for policy in Queueing]),
                name="tenant_queueing_known",
            ),
            models.CheckConstraint(
                condition=Q(idle_notify_after_min__isnull=True)
                | Q(idle_notify_after_min__gte=1, idle_notify_after_min__lte=IDLE_POLICY_MAX_MIN),
                name="tenant_idle_notify_range",
            ),
            models.CheckConstraint(
                condition=Q(idle_cancel_after_min__isnull=True)
                | Q(idle_cancel_after_min__gte=1, idle_cancel_after_min__lte=IDLE_POLICY_MAX_MIN),
                name="tenant_idle_cancel_range",
            ),
            models.CheckConstraint(
                condition=Q(idle_notify_after_min__isnull=True)
                | Q(idle_cancel_after_min__isnull=True)
                | Q(idle_cancel_after_min__gt=models.F("idle_notify_after_min")),
                name="tenant_idle_cancel_after_notify",
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class Project(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="projects")
    slug = models.SlugField(max_length=63, validators=[slug_validator])
    name = models.CharField(max_length=200)
    cost_center = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["tenant__slug", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="project_unique_slug"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"


class Membership(models.Model):
    class Role(models.TextChoices):
        RESEARCHER = "researcher", "Researcher"
        TENANT_ADMIN = "tenant_admin", "Tenant admin"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=Role.choices, default=Role.RESEARCHER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class Invitation(models.Model):
    """A tenant admin's offer of membership to whoever owns a username or an e-mail address.

    The inviter never learns whether such an account exists, nor which account an address
    belongs to: the person sees the invitation once signed in (tenants/invitations.py) and
    becomes a member only by accepting it.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        ACCEPTED = "accepted", "Accepted"
        DECLINED = "declined", "Declined"
        REVOKED = "revoked", "Revoked"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    # A username as typed (exact), or an e-mail address in lower case.
    identifier = models.CharField(max_length=254)
    role = models.CharField(
        max_length=20, choices=Membership.Role.choices, default=Membership.Role.RESEARCHER
    )
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "identifier"],
                condition=Q(state="pending"),
                name="invitation_one_pending",
            ),
        ]
        indexes = [models.Index(fields=["identifier", "state"], name="invitation_identifier")]

    def __str__(self) -> str:
        return f"{self.identifier} to {self.tenant} ({self.state})"


class GpuFlavor(models.Model):
    """A kind of GPU a run can ask for: a full device or a MIG slice."""

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    memory_gb = models.PositiveIntegerField()
    # 1.0 for a full GPU, 1/7 for an a100 1g.10gb slice: lets reports weigh slices fairly.
    gpu_fraction = models.DecimalField(max_digits=5, decimal_places=4, default=1)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpu_fraction__gt=0) & Q(gpu_fraction__lte=1),
                name="flavor_fraction_in_range",
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def max_per_node(self) -> int:
        """The most GPUs of this flavor one node can have: 16 full GPUs (the largest
        servers built), each cut into as many slices as the flavor's fraction allows."""
        return int(MAX_FULL_GPUS_PER_NODE / self.gpu_fraction)


MAX_FULL_GPUS_PER_NODE = 16


class Quota(models.Model):
    class BudgetMode(models.TextChoices):
        HARD = "hard", "Hard: runs wait when the budget is spent"
        SOFT = "soft", "Soft: runs start and are flagged"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    flavor = models.ForeignKey(GpuFlavor, on_delete=models.PROTECT, related_name="quotas")
    guaranteed_gpus = models.PositiveIntegerField(default=0)
    borrow_limit_gpus = models.PositiveIntegerField(default=0)
    max_gpus_per_run = models.PositiveIntegerField(null=True, blank=True)
    monthly_gpu_hour_budget = models.PositiveIntegerField(null=True, blank=True)
    budget_mode = models.CharField(
        max_length=8, choices=BudgetMode.choices, default=BudgetMode.HARD
    )
    fair_share_weight = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])

    class Meta:
        ordering = ["tenant__slug", "flavor__slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "flavor"], name="quota_unique"),
            models.CheckConstraint(condition=Q(fair_share_weight__gte=1), name="quota_weight"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}:{self.flavor.slug} guaranteed={self.guaranteed_gpus}"


class AuditLogAppendOnly(Exception):
    """Somebody tried to change or remove a row of the audit log."""

    def __init__(self, operation: str) -> None:
        super().__init__(
            f"The audit log is append-only: AuditEvent rows cannot be {operation}. Record a "
            "new event instead (tenants.services.audit.audit_record)."
        )


class AuditEventQuerySet(models.QuerySet):
    """Reads and inserts only: every bulk way the ORM has to change or remove rows raises."""

    def update(self, **kwargs):
        raise AuditLogAppendOnly("updated")

    def bulk_update(self, objs, fields, batch_size=None):
        raise AuditLogAppendOnly("updated")

    def delete(self):
        raise AuditLogAppendOnly("deleted")

    def _raw_delete(self, using):  # what Django's deletion collector calls for fast deletes
        raise AuditLogAppendOnly("deleted")


class AuditEvent(models.Model):
    """Append-only record of a change made by a person: who, when, what, before and after.

    Append-only twice over: the ORM refuses to update or delete a row (``save`` of a stored
    event, ``delete``, ``QuerySet.update``/``delete``), and on PostgreSQL a trigger refuses
    UPDATE and DELETE from anybody (migration 0005).

    The actor and the tenant are PROTECTed, not SET_NULL: nulling them out would be an
    UPDATE of the log that erases who made a change, the one thing the log is for. A user
    or tenant that appears in the log is deactivated (``is_active``, ``active``) instead of
    deleted; deleting one raises ProtectedError, which says so, rather than failing
    silently in the trigger or leaving events without their actor.
    """

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+"
    )
    tenant = models.ForeignKey(Tenant, null=True, on_delete=models.PROTECT, related_name="+")
    action = models.CharField(max_length=64)
    target = models.CharField(max_length=200)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        # Django reaches related rows through the base manager (deletion, related lookups):
        # the guarded one there too.
        base_manager_name = "objects"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.target}"

    def save(self, *args, **kwargs):
        if not self._state.adding:
            raise AuditLogAppendOnly("updated")
        # Always an INSERT: with a primary key given, Django would otherwise try an UPDATE
        # of the row that has it first.
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AuditLogAppendOnly("deleted")


class ApiToken(models.Model):
    """A personal API token. Only its SHA-256 is stored; the secret is shown once.

    A token is bound to the password its owner had when it was made (``credential_stamp``):
    once the password changes, by whatever path (the account page, Django admin,
    ``manage.py changepassword``, a shell), the token no longer authenticates."""

    PREFIX_LENGTH = 8

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, default="api")
    prefix = models.CharField(max_length=PREFIX_LENGTH, db_index=True)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # ``stamp_for(user)`` when the token was made; see the class docstring.
    credential_stamp = models.CharField(max_length=64)
    # The one-time key of the account page's form that made the token: the same form sent
    # twice (a double click, a reload, concurrent posts) makes one token
    # (``api_token_issue_once``), as the submit form queues one run (``Run.submission_key``).
    submission_key = models.UUIDField(null=True, blank=True, editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "submission_key"],
                condition=Q(submission_key__isnull=False),
                name="apitoken_submission_key_once",
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.name} ({self.prefix}…)"

    @staticmethod
    def stamp_for(user) -> str:
        """A digest of the user's stored password hash (itself salted): it changes whenever
        the password does, and tells nothing the password hash beside it would not."""
        return hashlib.sha256(
            b"gantry.api-token.credential-stamp:" + user.password.encode()
        ).hexdigest()

    @property
    def outlived_password(self) -> bool:
        """The owner's password changed since the token was made: it is revoked."""
        return not secrets.compare_digest(self.credential_stamp, self.stamp_for(self.user))

    @staticmethod
    def new_secret() -> str:
        return "gty_" + secrets.token_urlsafe(32)

    @staticmethod
    def hash_secret(secret: str) -> str:
        return hashlib.sha256(secret.encode()).hexdigest()


class Notification(models.Model):
    """An in-app message to one user; e-mail, when sent, is a copy of it."""

    class Kind(models.TextChoices):
        BUDGET_80 = "budget_80", "80 % of a monthly budget used"
        BUDGET_100 = "budget_100", "Monthly budget spent"
        IDLE_WARNING = "idle_warning", "A run's GPUs are idle"
        IDLE_CANCELLED = "idle_cancelled", "A run was cancelled for idle GPUs"
        WORKSPACE_IDLE = "ws_idle", "A workspace is idle and will be suspended"
        WORKSPACE_SUSPENDED = "ws_suspended", "A workspace was suspended"
        INVITATION = "invitation", "An invitation to join a tenant"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications"
    )
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    message = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "read_at"], name="notification_user_unread")]

    def __str__(self) -> str:
        return f"{self.user} {self.kind} {self.created_at:%Y-%m-%d %H:%M}"

    @property
    def is_unread(self) -> bool:
        return self.read_at is None


class LoginFailure(models.Model):
    """One failed password login, kept while it counts towards a lockout.

    In the database rather than in process memory so every web worker sees the same counts
    (tenants/authentication.py reads and prunes them).
    """

    username = models.CharField(max_length=150, help_text="As typed, lower-cased")
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    at = models.DateTimeField(db_index=True)

    class Meta:
        indexes = [
            models.Index(fields=["username", "at"], name="loginfailure_username_at"),
            models.Index(fields=["ip_address", "at"], name="loginfailure_ip_at"),
        ]

    def __str__(self) -> str:
        return f"{self.username} from {self.ip_address} at {self.at:%Y-%m-%d %H:%M:%S}"


class ExternalIdentity(models.Model):
    """Links a user to the subject an OpenID Connect provider knows them by (tenants/oidc.py).

    The subject, not the e-mail or the user name, identifies a person at a provider: those
    can change or be chosen by the person, the subject cannot.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_identities"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="identity_unique_subject"),
        ]

    def __str__(self) -> str:
        return f"{self.user} = {self.subject} at {self.issuer}"
