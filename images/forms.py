"""Forms of the image catalog pages: they parse types only; images.services holds every rule."""

from django import forms

from core.forms import ServiceErrorsMixin
from images.models import MAX_REGISTRY_TIMEOUT_S, Registry
from tenants.models import Tenant

_CODE = {"spellcheck": "false", "autocomplete": "off", "autocapitalize": "off"}


class RegistryForm(ServiceErrorsMixin, forms.Form):
    name = forms.CharField(
        label="Name",
        help_text="A short slug, e.g. internal or ngc; it cannot change later.",
        widget=forms.TextInput(attrs=_CODE),
    )
    url = forms.CharField(
        label="URL",
        help_text="http(s)://host[:port]. Image names start with this host, e.g. "
        "registry.example.org/team/pytorch.",
        widget=forms.TextInput(attrs=_CODE),
    )
    auth_kind = forms.ChoiceField(
        label="Authentication",
        choices=Registry.AuthKind.choices,
        help_text="Token: the registry sends clients to its token server; a username and "
        "password are optional there.",
    )
    username = forms.CharField(label="Username", required=False, widget=forms.TextInput(_CODE))
    password_secret_ref = forms.CharField(
        label="Password: environment variable",
        required=False,
        help_text="The NAME of the environment variable that holds the password on the portal "
        "and its workers, e.g. GANTRY_REGISTRY_INTERNAL_PASSWORD. Gantry reads it when it calls "
        "the registry and never stores the password.",
        widget=forms.TextInput(attrs=_CODE),
    )
    ca_bundle_path = forms.CharField(
        label="CA bundle",
        required=False,
        help_text="Absolute path of a PEM file, for a registry whose certificate a private CA "
        "signed. Leave empty to trust the system's CAs.",
        widget=forms.TextInput(attrs=_CODE),
    )
    timeout_s = forms.IntegerField(
        label="Timeout (seconds)",
        widget=forms.NumberInput(attrs={"min": 1, "max": MAX_REGISTRY_TIMEOUT_S, "step": 1}),
        help_text="For each request to the registry.",
    )
    enabled = forms.BooleanField(
        label="Enabled", required=False, help_text="Disabled registries import and resolve nothing."
    )

    def __init__(self, *args, editing: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if editing:
            del self.fields["name"]


def registry_initial(registry: Registry | None) -> dict:
    registry = registry or Registry()
    return {name: getattr(registry, name) for name in RegistryForm.base_fields}


class ImageImportForm(ServiceErrorsMixin, forms.Form):
    registry = forms.ModelChoiceField(
        label="Registry",
        queryset=Registry.objects.filter(enabled=True),
        to_field_name="name",
        empty_label="Choose a registry",
    )
    reference = forms.CharField(
        label="Image",
        help_text="The path inside the registry with a tag or a digest: team/pytorch:2.4 or "
        "team/pytorch@sha256:<64 hex>. A tag is resolved to its digest now; the catalog "
        "keeps the digest.",
        widget=forms.TextInput(attrs=_CODE),
    )
    description = forms.CharField(label="Description", required=False)


class ImageVisibilityForm(ServiceErrorsMixin, forms.Form):
    visible_to_all = forms.BooleanField(label="Visible to all tenants", required=False)
    allowed_tenants = forms.ModelMultipleChoiceField(
        label="Allowed tenants",
        queryset=Tenant.objects.filter(active=True),
        to_field_name="slug",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Used when the image is not visible to all tenants.",
    )
