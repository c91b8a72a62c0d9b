"""Reads of experiments, scoped to what the user may see."""

from django.db.models import QuerySet

from jobs.access import experiment_list_viewable
from jobs.models import Attempt, Experiment
from tenants.types import UserLike


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
    return {
        "image": experiment.image_reference,
        "command": experiment.command,
        "env": experiment.env,
        "code_repository": experiment.code_repository,
        "code_commit": experiment.code_commit,
        "dataset_uri": experiment.dataset_uri,
        "dataset_version": experiment.dataset_version,
        "params": experiment.params,
        "flavor": experiment.flavor.slug,
        "nodes": experiment.nodes,
        "gpus_per_node": experiment.gpus_per_node,
        "topology_level": experiment.topology_level,
        "topology_mode": experiment.topology_mode,
        "priority": experiment.priority,
        "max_runtime_minutes": experiment.max_runtime_minutes,
        "max_restarts": experiment.max_restarts,
        "checkpoint_dir": experiment.checkpoint_dir,
        "gantry_version": experiment.gantry_version,
    }


def experiment_attempts(*, experiment: Experiment) -> QuerySet[Attempt]:
    """Every attempt of every run of the experiment, in one query, run by run."""
    return (
        Attempt.objects.filter(run__experiment=experiment)
        .select_related("cluster")
        .order_by("-run_id", "number")
    )
