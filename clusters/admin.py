from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from clusters.models import Cluster, ClusterFlavor
from clusters.services.health import cluster_health_policy_check, cluster_health_policy_set
from tenants.admin import AuditedAdmin, ReadOnlyAdminMixin


class ClusterFlavorInline(ReadOnlyAdminMixin, admin.TabularInline):
    """Capacity comes from the backend's inventory, or the capacity page for simulators."""

    model = ClusterFlavor
    extra = 0


class ClusterAdminForm(forms.ModelForm):
    """The health policy is checked as ``cluster_health_policy_set`` checks it (its keys and
    values, and the blast radius now), so a refusal is shown on the field, not raised."""

    class Meta:
        model = Cluster
        fields = ["name", "backend", "settings", "enabled", "queueing", "health_policy"]
        help_texts = {
            "health_policy": "Only what differs from the defaults, e.g. "
            '{"actions": {"thermal_throttle": "observe"}, "max_quarantined_share": 0.5}; '
            "docs/node-health.md lists the keys."
        }

    def clean_health_policy(self):
        raw = self.cleaned_data.get("health_policy") or {}
        try:
            cluster_health_policy_check(cluster=self.instance, raw=raw)
        except ValidationError as exc:
            raise ValidationError(exc.messages) from None  # the field's, not a dict of fields
        return raw


@admin.register(Cluster)
class ClusterAdmin(AuditedAdmin):
    form = ClusterAdminForm
    list_display = ["name", "backend", "enabled", "queueing", "last_sync_at", "last_error"]
    inlines = [ClusterFlavorInline]
    # What the backends report: the sync writes it, nobody edits it.
    readonly_fields = [
        "last_sync_at",
        "last_error",
        "inventory_at",
        "inventory_valid_until",
        "inventory_error",
        "topology_levels",
        "inventory_problems",
        "outside_claims",
    ]

    def save_model(self, request, obj, form, change):
        # The policy is set through its service (audited as "cluster.health_policy", stored
        # as its overrides), after the rest of the cluster is saved and audited.
        form.health_policy_wanted = obj.health_policy or {}
        stored = Cluster.objects.get(pk=obj.pk).health_policy if change else {}
        obj.health_policy = stored
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        wanted = form.health_policy_wanted
        if wanted != form.instance.health_policy:
            cluster_health_policy_set(cluster=form.instance, actor=request.user, raw=wanted)
