"""The fields of an experiment: the one table that everything else about them reads.

The spec parser and its JSON Schema (``jobs.spec``), the submit form, its page and its quota
check (``jobs.forms``, ``jobs.views.submit``; the page's layout in ``FORM_ROWS``), the API
(``jobs.serializers.experiments``), the submit's checks of ranges and lengths
(``jobs.services.submission``) and the reproducibility record and its diff
(``jobs.reproducibility``, ``jobs.selectors.experiments``; the rows' order in
``RECORD_ORDER``) all take their fields, names, labels, help texts and limits from
``FIELDS``. A field is named by its ``ExperimentInput`` name everywhere (form field, API key,
``Experiment`` attribute, error key); only a spec document nests it under its dotted
``spec`` name, and only the spec's own edge speaks that name.

To add a field: an entry here, a column on ``jobs.models.Experiment`` (and its migration)
and an attribute of ``jobs.services.submission.ExperimentInput`` (typed, so mypy checks its
readers; ``tests/jobs/test_experiment_fields.py`` holds the two to this table), plus its
rule in ``experiment_validate`` if it has one beyond its type and limits.

No Django here: the spec parser, which is pure, reads it too.
"""

from dataclasses import dataclass
from typing import Any, Literal

from core.ids import MAX_ID

COMMIT_PATTERN = r"^[0-9a-f]{40}$"
TOPOLOGY_MODES = ("preferred", "required")  # jobs.models.TopologyMode


class Required:
    """The default of a field the request must give."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = Required()


@dataclass(frozen=True)
class ExperimentField:
    name: str  # ExperimentInput field, form field, API key, Experiment attribute, error key
    spec: str  # dotted name in a spec document, e.g. "resources.nodes"; "" if not in one
    type: Literal["string", "integer", "object"]  # JSON type
    label: str
    help: str = ""  # under the submit form's field
    doc: str = ""  # the API's and the spec schema's description
    # Longest value the API takes (the column or slug it is stored in or looked up by).
    max_length: int | None = None
    # Free text stored as is: the spec schema states its max_length and the submit refuses
    # a longer one or one with NUL characters.
    text: bool = False
    minimum: int | None = None
    maximum: int | None = None
    pattern: str = ""
    choices: tuple[str, ...] = ()
    default: Any = REQUIRED  # in ExperimentInput; a dict default is a fresh empty dict
    initial: Any = None  # the submit form's first value, when not the default
    widget: Literal["", "select", "textarea", "json"] = ""  # the submit form's input
    form_row: str = ""  # the submit form's row (FORM_ROWS) it is in; "" if not shown there
    preview: bool = False  # sent to the submit form's quota check
    record_label: str = ""  # its row's label in a diff (RECORD_ORDER), when not ``label``
    input: bool = True  # a value a request gives (not only one the server records)

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def row_label(self) -> str:
        return self.record_label or self.label


# Canonical order: the order of keys in an exported spec and of the API's input.
FIELDS: tuple[ExperimentField, ...] = (
    ExperimentField(
        "tenant",
        "tenant",
        "string",
        "Tenant",
        help="Whose quota the run uses.",
        doc="Tenant slug.",
        max_length=63,
        widget="select",
        form_row="where",
        preview=True,
    ),
    ExperimentField(
        "project",
        "project",
        "string",
        "Project",
        help="GPU hours are accounted to this project of the tenant.",
        doc="Project slug within the tenant.",
        max_length=63,
        widget="select",
        form_row="where",
    ),
    ExperimentField(
        "name",
        "name",
        "string",
        "Name",
        help="Leave empty to name it after the project and the time.",
        max_length=200,
        text=True,
        default="",
        form_row="what",
    ),
    ExperimentField(
        "image",
        "image",
        "string",
        "Image",
        help="Approved images only; the run uses the image pinned by its digest.",
        doc="repository@sha256:<64 hex>, or repository:tag (resolved to a digest at submit).",
        max_length=400,
        widget="select",
        form_row="what",
    ),
    ExperimentField(
        "command",
        "command",
        "string",
        "Command",
        help="Run by a shell inside the container, e.g. python train.py --epochs 3.",
        doc="Shell command, at most 16 KiB.",
        widget="textarea",
        form_row="what",
    ),
    ExperimentField(
        "flavor",
        "resources.flavor",
        "string",
        "GPU flavor",
        doc="GPU flavor slug, e.g. a100-80gb.",
        max_length=63,
        widget="select",
        form_row="resources",
        preview=True,
    ),
    ExperimentField(
        "nodes",
        "resources.nodes",
        "integer",
        "Nodes",
        minimum=1,
        initial=1,
        form_row="resources",
        preview=True,
    ),
    ExperimentField(
        "gpus_per_node",
        "resources.gpus_per_node",
        "integer",
        "GPUs per node",
        minimum=1,
        initial=1,
        form_row="resources",
        preview=True,
    ),
    ExperimentField(
        "max_runtime_minutes",
        "resources.max_runtime_minutes",
        "integer",
        "Max runtime (minutes)",
        help="The run is stopped after this long.",
        minimum=1,
        maximum=30 * 24 * 60,
        default=24 * 60,
        form_row="resources",
    ),
    ExperimentField(
        "topology_level",
        "resources.topology_level",
        "string",
        "Topology",
        help="A level of the clusters' network its nodes should share (e.g. one leaf "
        "switch); by default as tight as the free nodes allow.",
        doc="A topology level of the clusters (e.g. leaf): the gang's nodes share one "
        "domain of it. Empty: as tight as admission can place it.",
        max_length=63,
        text=True,
        default="",
        widget="select",
        form_row="topology",
        preview=True,
        record_label="Topology level",
    ),
    ExperimentField(
        "topology_mode",
        "resources.topology_mode",
        "string",
        "Topology is",
        help="Required waits until one domain of the level has room for the whole gang.",
        doc="required: wait until one domain of the level has room; preferred (also "
        "empty): as tight as the free nodes allow.",
        choices=TOPOLOGY_MODES,
        default="",  # preferred: a mode says nothing without a level
        initial="preferred",
        form_row="topology",
        preview=True,
        record_label="Topology",
    ),
    ExperimentField(
        "code_repository",
        "code.repository",
        "string",
        "Code repository",
        help="Git URL of the code the image runs (recorded for reproducibility).",
        max_length=500,
        text=True,
        default="",
        form_row="code",
    ),
    ExperimentField(
        "code_commit",
        "code.commit",
        "string",
        "Code commit",
        help="Full 40-character commit SHA; required with a repository.",
        doc="40 lowercase hex characters.",
        max_length=40,
        pattern=COMMIT_PATTERN,
        default="",
        form_row="code",
    ),
    ExperimentField(
        "dataset_uri",
        "dataset.uri",
        "string",
        "Dataset URI",
        max_length=500,
        text=True,
        default="",
        form_row="code",
    ),
    ExperimentField(
        "dataset_version",
        "dataset.version",
        "string",
        "Dataset version",
        max_length=200,
        text=True,
        default="",
        form_row="code",
    ),
    ExperimentField(
        "params",
        "params",
        "object",
        "Parameters",
        help='A JSON object of hyperparameters, e.g. {"lr": 0.1}. At most 64 KiB.',
        doc="A JSON object of hyperparameters, at most 64 KiB.",
        default={},
        widget="json",
        form_row="json",
        record_label="Parameter",
    ),
    ExperimentField(
        "env",
        "env",
        "object",
        "Environment",
        help="A JSON object of variable names to strings. No secrets: it is stored as is.",
        doc="Non-secret environment variables: names to strings.",
        default={},
        widget="json",
        form_row="json",
    ),
    ExperimentField(
        "priority",
        "priority",
        "integer",
        "Priority",
        help="0-100; higher runs first within your tenant.",
        minimum=0,
        maximum=100,
        default=50,
        form_row="resources",
        preview=True,
    ),
    ExperimentField(
        "max_restarts",
        "max_restarts",
        "integer",
        "Max restarts",
        help="Requeue after a failure or preemption, resuming from the latest checkpoint.",
        minimum=0,
        maximum=20,
        default=0,
        form_row="resources",
    ),
    ExperimentField(
        "checkpoint_dir",
        "checkpoint_dir",
        "string",
        "Checkpoint directory",
        help="Where the job saves checkpoints; a restart resumes from the latest one.",
        max_length=500,
        text=True,
        default="",
        form_row="checkpoint",
    ),
    ExperimentField(
        "cloned_from",
        "",
        "integer",
        "Cloned from",
        doc="Id of the experiment this one is a clone of: an experiment of the same tenant "
        "that you can read.",
        minimum=1,
        maximum=MAX_ID,
        default=None,
    ),
    ExperimentField("gantry_version", "", "string", "Gantry version", input=False),
)
BY_NAME = {field.name: field for field in FIELDS}
INPUT_FIELDS = tuple(field for field in FIELDS if field.input)
SPEC_FIELDS = tuple(field for field in FIELDS if field.spec)
# The reproducibility record: the fields that say what ran, in the order a diff shows them
# (what, code and data, where, how long), the tenant, project and name being whose it is.
RECORD_ORDER = (
    "image",
    "command",
    "env",
    "code_repository",
    "code_commit",
    "dataset_uri",
    "dataset_version",
    "params",
    "flavor",
    "nodes",
    "gpus_per_node",
    "topology_level",
    "topology_mode",
    "priority",
    "max_runtime_minutes",
    "max_restarts",
    "checkpoint_dir",
    "gantry_version",
)
RECORD_FIELDS = tuple(BY_NAME[name] for name in RECORD_ORDER)
PREVIEW_FIELDS = tuple(field.name for field in FIELDS if field.preview)
# Checked at submit: the free texts' lengths, and the ranges of the integers that have both
# ends (an id's is the id's own check).
TEXT_LIMITS = {
    field.name: field.max_length
    for field in INPUT_FIELDS
    if field.text and field.max_length is not None
}
RANGES = {
    field.name: (field.minimum, field.maximum)
    for field in INPUT_FIELDS
    if field.spec and field.minimum is not None and field.maximum is not None
}
# The submit form's rows, in the order it shows them: each its fieldset's legend and its CSS
# class ("" for fields one under the other); a row's fields are in the order of FIELDS.
FORM_ROWS = {
    "where": ("Where", "grid"),
    "what": ("What", ""),
    "code": ("Code and data", "grid"),
    "json": ("Code and data", "grid"),
    "resources": ("Resources", "grid grid-3"),
    "topology": ("Resources", "grid"),
    "checkpoint": ("Resources", ""),
}
