"""Reads of experiments, scoped to what the user may see."""

from dataclasses import dataclass

from django.db.models import Count, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce

from core.types import UserLike, signed_in
from jobs.access import experiment_list_viewable
from jobs.experiment_fields import RECORD_FIELDS
from jobs.models import Attempt, Experiment, ExperimentTemplate, Run, RunState
from jobs.selectors.paging import keyset_page
from tenants.access import tenant_list_viewable
from tenants.models import Project, Tenant

# Large fields no experiment list shows.
EXPERIMENT_LIST_DEFERRED = ("command", "params", "env")


@dataclass(frozen=True)
class ExperimentFilters:
    """What an experiments list is narrowed to; empty values filter nothing.

    ``name``: part of the name, any case. ``owner``: a username, exactly (any case);
    ``mine``: the user's own. ``image``: part of the image reference (repository or
    digest). ``commit``: the start of the code commit. ``project``, ``template`` and
    ``tenant``: ids."""

    name: str = ""
    owner: str = ""
    mine: bool = False
    project: int | None = None
    image: str = ""
    commit: str = ""
    template: int | None = None
    tenant: int | None = None

    @property
    def any(self) -> bool:
        """Whether the user narrowed the list (``tenant`` is set by the compare picker)."""
        return any(getattr(self, name) for name in self.__dataclass_fields__ if name != "tenant")


@dataclass(frozen=True)
class ExperimentRow:
    """An experiment as lists show it: with how many runs it has and its latest run."""

    experiment: Experiment
    run_count: int
    last_run_id: int | None
    last_run_state: str

    @property
    def last_run_state_label(self) -> str:
        return RunState(self.last_run_state).label if self.last_run_state else ""

    @classmethod
    def of(cls, experiment: Experiment) -> "ExperimentRow":
        """From an experiment annotated by ``_with_runs``."""
        return cls(
            experiment=experiment,
            run_count=experiment.run_count,  # type: ignore[attr-defined]
            last_run_id=experiment.last_run_id,  # type: ignore[attr-defined]
            last_run_state=experiment.last_run_state or "",  # type: ignore[attr-defined]
        )


@dataclass(frozen=True)
class ExperimentPage:
    """One page of an experiments list, newest first, found by position like the run list
    (``jobs.selectors.runs.RunPage``): ``newer`` and ``older`` are the experiment ids to page
    from, None where nothing newer or older matches."""

    rows: list[ExperimentRow]
    newer: int | None
    older: int | None
    tenants: list[Tenant]


def _with_runs(experiments: QuerySet[Experiment]) -> QuerySet[Experiment]:
    """Each experiment with ``run_count`` and its latest run's ``last_run_id`` and
    ``last_run_state``, as subqueries of the same query (runs are their experiment's
    tenant's, so they need no scoping of their own)."""
    runs = Run.objects.filter(experiment=OuterRef("pk"))
    latest = runs.order_by("-submitted_at", "-id")
    counted = runs.order_by().values("experiment").annotate(count=Count("*")).values("count")
    return experiments.annotate(
        run_count=Coalesce(Subquery(counted, output_field=IntegerField()), 0),
        last_run_id=Subquery(latest.values("pk")[:1]),
        last_run_state=Subquery(latest.values("state")[:1]),
    )


def _filtered(
    experiments: QuerySet[Experiment], *, user: UserLike, filters: ExperimentFilters
) -> QuerySet[Experiment]:
    if filters.name:
        experiments = experiments.filter(name__icontains=filters.name)
    if filters.owner:
        experiments = experiments.filter(owner__username__iexact=filters.owner)
    if filters.mine:
        experiments = experiments.filter(owner=signed_in(user))
    if filters.project is not None:
        experiments = experiments.filter(project_id=filters.project)
    if filters.image:
        experiments = experiments.filter(image_reference__icontains=filters.image)
    if filters.commit:
        experiments = experiments.filter(code_commit__istartswith=filters.commit)
    if filters.template is not None:
        experiments = experiments.filter(template_id=filters.template)
    if filters.tenant is not None:
        experiments = experiments.filter(tenant_id=filters.tenant)
    return experiments


def experiment_page_viewable(
    *,
    user: UserLike,
    size: int,
    filters: ExperimentFilters = ExperimentFilters(),  # frozen: a shared default is safe
    before: int | None = None,
    after: int | None = None,
) -> ExperimentPage:
    """A page of the experiments the user may read (those of the tenants they may read;
    every tenant's for platform admins) matching ``filters``: the ``size`` just older than
    experiment ``before``, just newer than ``after``, or the newest ones.

    Two queries whatever the page and however many match: the readable tenants, and the
    page with its owners, projects, templates and run counts. A cursor only marks a
    position and must be readable; another tenant's experiment marks none (an empty page).
    """
    tenants = list(tenant_list_viewable(user=user))
    tenant_ids = [tenant.pk for tenant in tenants]
    matching = _filtered(
        Experiment.objects.filter(tenant_id__in=tenant_ids), user=user, filters=filters
    )
    listed = _with_runs(
        matching.select_related("project", "owner", "template").defer(*EXPERIMENT_LIST_DEFERRED)
    )
    rows, has_newer, has_older = keyset_page(
        listed,
        readable=Experiment.objects.filter(tenant_id__in=tenant_ids),
        field="created_at",
        size=size,
        before=before,
        after=after,
    )
    by_id = {tenant.pk: tenant for tenant in tenants}
    for experiment in rows:
        experiment.tenant = by_id[experiment.tenant_id]
    return ExperimentPage(
        rows=[ExperimentRow.of(experiment) for experiment in rows],
        newer=rows[0].pk if rows and has_newer else None,
        older=rows[-1].pk if rows and has_older else None,
        tenants=tenants,
    )


def experiment_filter_projects(*, tenants: list[Tenant]) -> QuerySet[Project]:
    """The projects an experiments list may be filtered by: those of ``tenants``."""
    return Project.objects.filter(tenant__in=tenants).select_related("tenant")


def experiment_filter_templates(*, tenants: list[Tenant]) -> QuerySet[ExperimentTemplate]:
    """The templates an experiments list may be filtered by: the global ones and those of
    ``tenants``."""
    return (
        ExperimentTemplate.objects.filter(Q(tenant__isnull=True) | Q(tenant__in=tenants))
        .select_related("tenant")
        .order_by("name", "tenant__slug", "id")
    )


def experiment_compare_choices(*, experiment: Experiment, limit: int) -> list[ExperimentRow]:
    """What an experiment may be compared with: the other experiments of its tenant, most
    recent first, at most ``limit``, each with its runs counted and its latest run (one
    query). The experiment itself must already be access-checked: its tenant is readable."""
    others = Experiment.objects.filter(tenant_id=experiment.tenant_id).exclude(pk=experiment.pk)
    recent = _with_runs(others.defer(*EXPERIMENT_LIST_DEFERRED)).order_by("-created_at", "-id")
    return [ExperimentRow.of(other) for other in recent[:limit]]


def experiment_get_viewable(*, user: UserLike, experiment_id: int) -> Experiment:
    return experiment_list_viewable(user=user).get(pk=experiment_id)


def experiment_pair_get_viewable(
    *, user: UserLike, a_id: int, b_id: int
) -> tuple[Experiment, Experiment]:
    """Two experiments to compare: both readable by the user and of the same tenant, else
    DoesNotExist alike for a missing one, another tenant's one, and a pair across tenants."""
    a = experiment_get_viewable(user=user, experiment_id=a_id)
    b = experiment_get_viewable(user=user, experiment_id=b_id)
    if a.tenant_id != b.tenant_id:
        raise Experiment.DoesNotExist("No such experiment")
    return a, b


def experiment_record(experiment: Experiment) -> dict:
    """The reproducibility record as plain data, the input of ``experiment_diff``."""
    return experiment.values_of(RECORD_FIELDS)


def experiment_attempts(*, experiment: Experiment) -> QuerySet[Attempt]:
    """Every attempt of every run of the experiment, in one query, run by run."""
    return (
        Attempt.objects.filter(run__experiment=experiment)
        .select_related("cluster")
        .order_by("-run_id", "number")
    )
