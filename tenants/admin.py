"""Django admin: staff only (Django's ``is_staff`` gate), then Django's model permissions.

Nothing changes here unaudited. What Gantry's own pages change (quotas, flavors, images,
templates, runs, rate cards) is read-only here, so it goes through their services, which
validate and audit. What only the admin can change (tenants, projects, memberships,
clusters, users and their roles, tokens) is recorded by ``AuditedAdmin``.
"""

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User

from tenants.credentials import user_deactivate
from tenants.models import ApiToken, AuditEvent, GpuFlavor, Membership, Project, Quota, Tenant
from tenants.services.audit import audit_model_change, audit_record, audit_snapshot
from tenants.services.tokens import CredentialsRevokedBecause, user_credentials_revoke


class ReadOnlyAdminMixin:
    """Shown, never changed here: the object changes through Gantry's services only."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class AuditedAdmin(admin.ModelAdmin):
    """Every add, change and delete made here, the inlines' included, is an AuditEvent
    "<model>.<create|update|delete>" with the object's fields before and after
    (``audit_snapshot``); ``audit_exclude`` names fields never recorded (secrets)."""

    audit_exclude: tuple[str, ...] = ()

    def _snapshot(self, instance, exclude=None) -> dict:
        return audit_snapshot(instance, exclude=self.audit_exclude if exclude is None else exclude)

    def save_model(self, request, obj, form, change):
        # The form has already written its values into ``obj``: "before" is the stored row.
        form.audit_before = self._snapshot(type(obj).objects.get(pk=obj.pk)) if change else None
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)  # many-to-many and inlines
        obj = form.instance
        audit_model_change(
            actor=request.user,
            instance=obj,
            verb="update" if change else "create",
            before=form.audit_before,
            after=self._snapshot(type(obj).objects.get(pk=obj.pk)),
        )

    def save_formset(self, request, form, formset, change):
        model = formset.model
        before = {
            id(inline_form.instance): audit_snapshot(model.objects.get(pk=inline_form.instance.pk))
            for inline_form in formset.initial_forms
            if inline_form.instance.pk is not None and inline_form.has_changed()
        }
        super().save_formset(request, form, formset, change)
        for obj in formset.new_objects:
            audit_model_change(
                actor=request.user,
                instance=obj,
                verb="create",
                before=None,
                after=audit_snapshot(obj),
            )
        for obj, _ in formset.changed_objects:
            audit_model_change(
                actor=request.user,
                instance=obj,
                verb="update",
                before=before[id(obj)],
                after=audit_snapshot(obj),
            )
        for obj in formset.deleted_objects:
            audit_model_change(
                actor=request.user, instance=obj, verb="delete", before=before[id(obj)], after=None
            )

    def delete_model(self, request, obj):
        before = self._snapshot(obj)
        super().delete_model(request, obj)
        audit_model_change(
            actor=request.user, instance=obj, verb="delete", before=before, after=None
        )

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            self.delete_model(request, obj)


class ProjectInline(admin.TabularInline):
    model = Project
    extra = 0


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ["user"]


class QuotaInline(ReadOnlyAdminMixin, admin.TabularInline):
    """Quotas change on the quota page, which checks them against the clusters."""

    model = Quota
    extra = 0


@admin.register(Tenant)
class TenantAdmin(AuditedAdmin):
    list_display = ["slug", "name", "cost_center", "active", "queueing"]
    search_fields = ["slug", "name"]
    inlines = [ProjectInline, MembershipInline, QuotaInline]


@admin.register(GpuFlavor)
class GpuFlavorAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Flavors change on the flavor pages (tenants:flavor_list)."""

    list_display = ["slug", "name", "memory_gb", "gpu_fraction"]


@admin.register(Quota)
class QuotaAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Quotas change on the quota page (jobs:quota_edit)."""

    list_display = ["tenant", "flavor", "guaranteed_gpus", "borrow_limit_gpus"]
    list_filter = ["flavor"]


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["at", "actor", "tenant", "action", "target"]
    list_filter = ["action"]


@admin.register(ApiToken)
class ApiTokenAdmin(AuditedAdmin):
    """Staff revoke a token by setting ``revoked_at``; a token is created by its owner only
    (its secret is shown once, to them)."""

    list_display = ["user", "name", "prefix", "created_at", "expires_at", "revoked_at"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at"]
    audit_exclude = ("key_hash", "last_used_at")

    def has_add_permission(self, request):
        return False


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class AuditedUserAdmin(AuditedAdmin, UserAdmin):
    """Users; their global roles are their groups. The password hash is never recorded:
    setting a password is audited as "user.password" without values. Deactivating, by the
    form or the action, goes through ``user_deactivate``, which revokes tokens and sessions."""

    audit_exclude = ("password", "last_login")
    actions = ["deactivate_selected"]

    def user_change_password(self, request, id, form_url=""):
        response = super().user_change_password(request, id, form_url)
        if request.method == "POST" and response.status_code == 302:
            user = User.objects.get(pk=id)
            audit_record(actor=request.user, action="user.password", target=f"user {user}")
            # Django keeps the admin's own session when they change their own password.
            user_credentials_revoke(
                user=user,
                actor=request.user,
                because=CredentialsRevokedBecause.PASSWORD_CHANGED,
                keep_session_key=request.session.session_key,
            )
        return response

    def save_model(self, request, obj, form, change):
        deactivating = (
            change and not obj.is_active and User.objects.filter(pk=obj.pk, is_active=True).exists()
        )
        if deactivating:
            obj.is_active = True  # the form's other changes first, then the one deactivation
        super().save_model(request, obj, form, change)
        if deactivating:
            user_deactivate(user=obj, actor=request.user)

    @admin.action(description="Deactivate the selected users", permissions=["change"])
    def deactivate_selected(self, request, queryset):
        done = sum(user_deactivate(user=user, actor=request.user) for user in queryset)
        self.message_user(request, f"{done} deactivated; their API tokens are revoked.")


@admin.register(Group)
class AuditedGroupAdmin(AuditedAdmin, GroupAdmin):
    pass
