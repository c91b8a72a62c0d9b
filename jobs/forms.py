"""The submit form: it parses types only. Every rule lives in
``jobs.services.submission.run_submit``."""

import json

from django import forms
from django.core.exceptions import ValidationError

from clusters.env_names import NAME_PATTERN
from core.forms import ServiceErrorsMixin
from core.parsers import MAX_JSON_DEPTH, TOO_DEEP, json_depth
from jobs import spec
from jobs.experiment_fields import BY_NAME, INPUT_FIELDS, ExperimentField
from jobs.models import Experiment, ExperimentTemplate, TopologyMode, WorkspaceServer
from jobs.services.submission import ExperimentInput, experiment_input_of
from jobs.services.workspaces import WorkspaceInput
from jobs.workspace_models import OFFERED_SERVERS
from tenants.models import GpuFlavor


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


class _DuplicateKey(ValueError):
    pass


def _refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    # json.loads would keep the last of two equal keys silently; a form row given twice is
    # more likely a mistake than an override.
    value: dict = {}
    for key, item in pairs:
        if key in value:
            raise _DuplicateKey(f"{key} is given twice: give each name once.")
        value[key] = item
    return value


def _parse_json(text: str):
    """JSON as PostgreSQL's jsonb can store it: no NaN/Infinity, no NUL characters, no key
    given twice in one object."""
    if not text.strip():
        return {}
    try:
        value = json.loads(
            text, parse_constant=_reject_constant, object_pairs_hook=_refuse_duplicate_keys
        )
    except RecursionError:
        raise ValidationError(TOO_DEEP) from None
    except _DuplicateKey as exc:
        raise ValidationError(str(exc)) from None
    except ValueError as exc:
        raise ValidationError(f"Not valid JSON: {exc}") from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise ValidationError(TOO_DEEP)
    if "\\u0000" in json.dumps(value):
        raise ValidationError("Must not contain NUL characters.")
    return value


def _select(**attrs) -> forms.Select:
    return forms.Select(attrs=attrs)


def _json_textarea(rows: int, editor: str, **attrs) -> forms.Textarea:
    """A JSON textarea that static/gantry/editors.js shows as a structured ``editor`` (the
    textarea stays the field the form sends, as its "Advanced: JSON" view)."""
    return forms.Textarea(
        attrs={
            "rows": rows,
            "spellcheck": "false",
            "class": "mono",
            "data-editor": editor,
            **attrs,
        }
    )


# The env names the submit accepts, for the editor's hints (the server checks them again).
ENV_NAME_PATTERN = "^" + NAME_PATTERN.pattern.removeprefix(r"\A").removesuffix(r"\Z") + "$"


def _experiment_field(field: ExperimentField) -> forms.Field:
    """The submit form's field for one experiment field: its type, label, help and first
    value, and the input the page shows. Only types are checked here; the limits the
    browser is told of are checked again, with the service's messages, by the service."""
    label, help_text = field.label, field.help
    attrs = dict(_WIDGET_ATTRS.get(field.name, {}))
    if field.type == "integer":
        limits = {"min": field.minimum, "max": field.maximum}
        attrs |= {key: value for key, value in limits.items() if value is not None}
        return forms.IntegerField(
            initial=field.default if field.initial is None else field.initial,
            label=label,
            help_text=help_text,
            widget=forms.NumberInput(attrs=attrs),
        )
    if field.choices:
        return forms.ChoiceField(
            required=False,
            choices=TopologyMode.choices,
            initial=field.initial,
            label=label,
            help_text=help_text,
        )
    if field.required:
        attrs = {"required": True, **attrs}
    widget: forms.Widget
    if field.widget == "json":
        rows, editor = _JSON_EDITORS[field.name]
        widget = _json_textarea(rows, editor, **attrs)
    elif field.widget == "select":
        widget = _select(**attrs)
    elif field.widget == "textarea":
        widget = forms.Textarea(attrs=attrs)
    else:
        widget = forms.TextInput(attrs=attrs)
    return forms.CharField(
        required=False,
        max_length=field.max_length if field.text and not field.widget else None,
        initial="{}" if field.widget == "json" else None,
        label=label,
        help_text=help_text,
        widget=widget,
    )


# What the submit page's inputs carry beyond what the table says (static/gantry/editors.js
# reads the data-* ones).
_WIDGET_ATTRS: dict[str, dict] = {
    "project": {"data-filter-by": "id_tenant"},
    "command": {"rows": 3, "spellcheck": "false"},
    "code_commit": {"spellcheck": "false", "autocomplete": "off"},
    "env": {"data-key-pattern": ENV_NAME_PATTERN},
}
_JSON_EDITORS = {"params": (4, "params"), "env": (3, "env")}
# The experiment fields the submit form shows, in the order of the table.
FORM_FIELDS = tuple(field for field in INPUT_FIELDS if field.form_row)


class RunSubmitForm(ServiceErrorsMixin, forms.Form):
    """Choices are offered for convenience; the service re-validates every value. The
    experiment's fields come from ``jobs.experiment_fields`` (``base_fields``, below)."""

    # Set by "Clone and edit": the experiment this one starts from (the service re-checks it).
    cloned_from = forms.IntegerField(
        required=False, min_value=1, max_value=2**63 - 1, widget=forms.HiddenInput
    )
    # A one-time key per rendered form: the service queues one run per key and user, so a
    # double click, the back button or a replayed POST cannot queue a second run.
    submission_key = forms.UUIDField(
        required=False,
        widget=forms.HiddenInput,
        error_messages={"invalid": "This form is damaged: open the submit page again."},
    )

    def __init__(
        self, *args, tenants, projects, images, flavor_limits, topology_levels=(), **kwargs
    ):
        super().__init__(*args, **kwargs)
        tenants = list(tenants)
        self.fields["tenant"].widget.choices = [("", "Choose a tenant")] + [
            (t.slug, f"{t.name} ({t.slug})") for t in tenants
        ]
        by_tenant: dict[str, list[tuple[str, str]]] = {t.slug: [] for t in tenants}
        for project in projects:
            by_tenant.setdefault(project.tenant.slug, []).append(
                (project.slug, f"{project.slug} - {project.name}")
            )
        self.fields["project"].widget.choices = [("", "Choose a project")] + [
            (slug, choices) for slug, choices in by_tenant.items() if choices
        ]
        self.fields["image"].widget.choices = [("", "Choose an image")] + [
            (image.reference, _image_label(image)) for image in images
        ]
        self.fields["flavor"].widget.choices = [("", "Choose a GPU flavor")] + [
            (slug, f"{slug} (up to {nodes} nodes × {gpus} GPUs)")
            for slug, (nodes, gpus) in sorted(flavor_limits.items())
        ]
        self.fields["topology_level"].widget.choices = [("", "As tight as possible")] + [
            (level, f"One {level}") for level in topology_levels
        ]

    def clean_command(self) -> str:
        # Browsers send textarea line breaks as CRLF; the shell wants LF.
        return self.cleaned_data["command"].replace("\r\n", "\n")

    def clean_params(self):
        return _parse_json(self.cleaned_data["params"])

    def clean_env(self):
        return _parse_json(self.cleaned_data["env"])

    def lock(self, template: ExperimentTemplate) -> None:
        """Show the template's locked fields read-only, with the template's values (pass
        them as ``initial``). The browser does not send disabled inputs; a request that
        does is checked against the template by the service, see ``template_values``."""
        for name in template.locked:
            field = self.fields[spec.BY_DOTTED[name].name]
            field.disabled = True
            field.help_text = f"Set by template {template.name}."

    def template_values(self) -> dict:
        """The values to overlay on the template: every editable field, and a locked one
        only if the request sent it anyway (so the service reports it changed)."""
        values = {}
        for name, field in self.fields.items():
            if name not in spec.BY_FIELD and name != "cloned_from":
                continue
            if not field.disabled:
                values[name] = self.cleaned_data[name]
            elif name in self.data:
                values[name] = self._clean_sent(name, field)
        return values

    def _clean_sent(self, name: str, field: forms.Field):
        raw = field.widget.value_from_datadict(self.data, self.files, self.add_prefix(name))
        try:
            value = field.clean(raw)
            if BY_NAME[name].type == "object":
                return _parse_json(value)
        except ValidationError:
            return raw
        return value.replace("\r\n", "\n") if name == "command" else value

    def experiment_input(self) -> ExperimentInput:
        return ExperimentInput(
            **{field.name: self.cleaned_data[field.name] for field in INPUT_FIELDS}
        )


# The experiment's fields first, then the form's own.
RunSubmitForm.base_fields = {
    **{field.name: _experiment_field(field) for field in FORM_FIELDS},
    **RunSubmitForm.base_fields,
}


def _image_label(image) -> str:
    name = f"{image.repository}:{image.tag}" if image.tag else image.repository
    return f"{name} ({image.digest[:19]}…)"


def initial_from_experiment(experiment: Experiment) -> dict:
    """Form values that record a clone of the experiment: the same values, and its id."""
    initial = vars(experiment_input_of(experiment)) | {"cloned_from": experiment.pk}
    for field in FORM_FIELDS:
        if field.type == "object":
            initial[field.name] = json.dumps(initial[field.name], indent=2, sort_keys=True)
    return initial


def initial_from_template(template: ExperimentTemplate) -> dict:
    """Form values that start from a template: its defaults. The page sends the
    template's id along (``template``), outside the form."""
    values, _ = spec.template_values_parse(template.values)  # checked when saved
    initial: dict = dict(values or {})
    if template.tenant is not None:  # no query when tenant_id is None
        initial["tenant"] = template.tenant.slug
    for field in FORM_FIELDS:
        if field.type == "object" and field.name in initial:
            initial[field.name] = json.dumps(initial[field.name], indent=2, sort_keys=True)
    return initial


def _template_field_meta(field: ExperimentField) -> dict:
    meta: dict = {"name": field.spec, "type": field.type}
    if field.choices:
        meta["choices"] = list(field.choices)
    if field.widget == "textarea":
        meta["multiline"] = True
    return meta


# What the defaults editor offers: the fields a template sets, with their JSON types.
_TEMPLATE_FIELDS_META = json.dumps(
    [_template_field_meta(spec.BY_DOTTED[name]) for name in spec.TEMPLATE_FIELDS]
)


class TemplateForm(ServiceErrorsMixin, forms.Form):
    """Types only; ``jobs.services.templates.template_save`` checks values, locks and ranges."""

    tenant = forms.ChoiceField(
        required=False, help_text="Global templates (platform admins only) serve every tenant."
    )
    name = forms.CharField(max_length=63, help_text="Lowercase letters, digits and dashes.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    values = forms.CharField(
        required=False,
        initial="{}",
        label="Defaults",
        widget=_json_textarea(10, "template-values", **{"data-fields": _TEMPLATE_FIELDS_META}),
        help_text='Defaults as a partial spec (JSON), e.g. {"image": "…", "resources": '
        '{"flavor": "a100-80gb", "nodes": 1, "gpus_per_node": 2}}.',
    )
    locked = forms.CharField(
        required=False,
        label="Locked fields",
        widget=forms.Textarea(
            attrs={
                "rows": 3,
                "spellcheck": "false",
                "class": "mono",
                "data-editor": "template-locks",
                "data-fields": json.dumps(spec.TEMPLATE_FIELDS),
            }
        ),
        help_text="Spec fields submissions may not change, one per line, e.g. image or "
        "resources.flavor. A locked field needs a default.",
    )
    ranges = forms.CharField(
        required=False,
        initial="{}",
        widget=_json_textarea(
            4, "template-ranges", **{"data-fields": json.dumps(spec.RANGE_FIELDS)}
        ),
        help_text='Allowed ranges (JSON), e.g. {"resources.gpus_per_node": {"min": 1, "max": 4}}. '
        "A ranged field needs a default inside its range.",
    )

    def __init__(self, *args, tenants=None, allow_global=False, **kwargs):
        super().__init__(*args, **kwargs)
        if tenants is None:  # editing: a template stays with its tenant
            del self.fields["tenant"]
            return
        choices = [("", "Global (every tenant)")] if allow_global else []
        tenant_field = self.fields["tenant"]
        assert isinstance(tenant_field, forms.ChoiceField)
        tenant_field.choices = choices + [(t.slug, f"{t.name} ({t.slug})") for t in tenants]
        tenant_field.required = not allow_global

    def clean_values(self):
        return _parse_json(self.cleaned_data["values"])

    def clean_ranges(self):
        return _parse_json(self.cleaned_data["ranges"])

    def clean_locked(self) -> list[str]:
        return self.cleaned_data["locked"].replace(",", " ").split()


def template_initial(template: ExperimentTemplate) -> dict:
    return {
        "name": template.name,
        "description": template.description,
        "values": json.dumps(template.values, indent=2),
        "locked": "\n".join(template.locked),
        "ranges": json.dumps(template.ranges, indent=2),
    }


def _count_errors(label: str, noun: str) -> dict[str, str]:
    return {
        "required": f"Enter {noun}.",
        "invalid": f"{label}: enter a whole number.",
        "min_value": f"{label}: at least 1.",
    }


class RunPreviewForm(forms.Form):
    """The submit form's fields that decide admission, as the preview panel sends them."""

    tenant = forms.CharField(error_messages={"required": "Choose a tenant."})
    flavor = forms.CharField(error_messages={"required": "Choose a GPU flavor."})
    nodes = forms.IntegerField(
        min_value=1, error_messages=_count_errors("Nodes", "the number of nodes")
    )
    gpus_per_node = forms.IntegerField(
        min_value=1, error_messages=_count_errors("GPUs per node", "the GPUs per node")
    )
    priority = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=100,
        error_messages=dict.fromkeys(
            ("invalid", "min_value", "max_value"), "Priority is a whole number from 0 to 100."
        ),
    )

    topology_level = forms.CharField(required=False, max_length=63)
    topology_mode = forms.ChoiceField(
        required=False,
        choices=TopologyMode.choices,
        error_messages={"invalid_choice": "Topology is either preferred or required."},
    )

    def clean_priority(self) -> int:
        priority = self.cleaned_data["priority"]
        return 50 if priority is None else priority

    def preview_arguments(self) -> dict:
        """The cleaned values as ``admission_preview`` takes them."""
        data = dict(self.cleaned_data)
        data["topology_required"] = data.pop("topology_mode") == TopologyMode.REQUIRED
        return data


class ClusterCapacityForm(ServiceErrorsMixin, forms.Form):
    flavor = forms.ModelChoiceField(
        label="GPU flavor", queryset=GpuFlavor.objects.order_by("slug"), to_field_name="slug"
    )
    nodes = forms.IntegerField(label="Nodes", widget=forms.NumberInput(attrs={"min": 1}))
    gpus_per_node = forms.IntegerField(
        label="GPUs per node", widget=forms.NumberInput(attrs={"min": 1})
    )


class WorkspaceLaunchForm(ServiceErrorsMixin, forms.Form):
    """The launch form of a workspace: choices for convenience, the service
    (``workspace_launch``) validates every value again."""

    tenant = forms.CharField(max_length=63, widget=_select())
    project = forms.CharField(max_length=63, widget=_select())
    name = forms.CharField(
        max_length=200, required=False, help_text="Optional; by default the project and the time."
    )
    image = forms.CharField(max_length=400, widget=_select())
    flavor = forms.CharField(max_length=63, widget=_select(), label="GPU flavor")
    gpus = forms.IntegerField(min_value=1, max_value=64, initial=1, label="GPUs")
    server = forms.ChoiceField(
        choices=[(server.value, server.label) for server in OFFERED_SERVERS],
        initial=WorkspaceServer.JUPYTER,
    )
    hours = forms.IntegerField(
        min_value=1,
        initial=4,
        help_text="Its GPUs are released after this long; Extend adds time within your "
        "tenant's maximum.",
    )
    submission_key = forms.UUIDField(
        required=False,
        widget=forms.HiddenInput,
        error_messages={"invalid": "This form is damaged: open the launch page again."},
    )

    def __init__(self, *args, tenants, projects, images, flavor_limits, **kwargs):
        super().__init__(*args, **kwargs)
        tenants = list(tenants)
        self.fields["tenant"].widget.choices = [("", "Choose a tenant")] + [
            (t.slug, f"{t.name} ({t.slug}, up to {t.workspace_max_hours} h)") for t in tenants
        ]
        by_tenant: dict[str, list[tuple[str, str]]] = {t.slug: [] for t in tenants}
        for project in projects:
            by_tenant.setdefault(project.tenant.slug, []).append(
                (project.slug, f"{project.slug} - {project.name}")
            )
        self.fields["project"].widget.choices = [("", "Choose a project")] + [
            (slug, choices) for slug, choices in by_tenant.items() if choices
        ]
        self.fields["image"].widget.choices = [("", "Choose an image")] + [
            (image.reference, _image_label(image)) for image in images
        ]
        self.fields["flavor"].widget.choices = [("", "Choose a GPU flavor")] + [
            (slug, f"{slug} (up to {gpus} GPUs on one node)")
            for slug, (_nodes, gpus) in sorted(flavor_limits.items())
        ]

    def workspace_input(self) -> WorkspaceInput:
        data = self.cleaned_data
        return WorkspaceInput(
            tenant=data["tenant"],
            project=data["project"],
            image=data["image"],
            flavor=data["flavor"],
            gpus=data["gpus"],
            server=data["server"],
            name=data["name"],
            hours=data["hours"],
        )


def workspace_initial_from_template(template: ExperimentTemplate) -> dict:
    """What a template gives a workspace: its tenant, image, flavor and GPUs per node (a
    workspace is one node). Its command, nodes and ranges are a batch run's: not applied."""
    values, _ = spec.template_values_parse(template.values)  # checked when saved
    values = values or {}
    initial = {
        "image": values.get("image"),
        "flavor": values.get("flavor"),
        "gpus": values.get("gpus_per_node"),
        "tenant": template.tenant.slug if template.tenant is not None else None,
    }
    return {name: value for name, value in initial.items() if value is not None}


class WorkspaceExtendForm(forms.Form):
    hours = forms.IntegerField(min_value=1, max_value=7 * 24, initial=1)
