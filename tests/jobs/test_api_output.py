"""The runs API writes runs, attempts and events by hand (jobs/serializers/runs.py, "Output by
hand"): exactly what DRF's generic walk over the declared fields wrote, for runs in every
state, in any time zone and datetime format."""

from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from jobs.models import (
    Attempt,
    AttemptState,
    FailureReason,
    Run,
    RunEvent,
    RunState,
    WaitReason,
)
from jobs.selectors.runs import run_attempts, run_events, run_get_viewable, run_page_viewable
from jobs.serializers.runs import (
    AttemptSerializer,
    RunDetailSerializer,
    RunEventSerializer,
    RunSerializer,
)
from jobs.services.admission_cycle import admission_run_cycle
from jobs.services.backend_submit import attempt_submit
from jobs.services.backend_sync import attempt_report_runtime
from jobs.services.lifecycle import run_cancel
from jobs.services.submission import run_submit
from tests.conftest import experiment_input

ESTIMATED = datetime(2026, 3, 1, 9, 30, 15, 123456, tzinfo=UTC)
ESTIMATES = {
    "start_expected_at": ESTIMATED + timedelta(minutes=20),
    "start_full_limits_at": ESTIMATED + timedelta(hours=2),
    "start_estimated_at": ESTIMATED,
    "start_note": "",
}


def drf_walk(serializer_class, instance, **kwargs) -> dict:
    """DRF's generic Serializer.to_representation over the serializer's declared fields."""
    serializer = serializer_class(instance, **kwargs)
    return serializers.ModelSerializer.to_representation(serializer, instance)


def run_as_drf_wrote_it(run: Run, *, detail: bool, viewer) -> dict:
    """The output before the by-hand serializers: DRF's walk, then the estimates blanked
    for runs that are not queued, and nested attempts and events by DRF's walk as well."""
    serializer_class = RunDetailSerializer if detail else RunSerializer
    context = {"request": type("Request", (), {"user": viewer})()}
    data = drf_walk(serializer_class, run, context=context)
    if run.state != RunState.QUEUED:
        data |= dict.fromkeys(("start_expected_at", "start_full_limits_at", "start_estimated_at"))
        data["start_note"] = ""
    if detail:
        data["attempts"] = [drf_walk(AttemptSerializer, a) for a in run_attempts(run=run)]
        data["events"] = [drf_walk(RunEventSerializer, e) for e in run_events(run=run, user=viewer)]
    return data


def assert_same_output(fast, generic) -> None:
    """Equal values, keys in the same order, and the same JSON (True is not 1 there)."""
    assert fast == generic
    assert list(fast) == list(generic)
    for nested in ("attempts", "events"):
        for fast_item, generic_item in zip(
            fast.get(nested, []), generic.get(nested, []), strict=True
        ):
            assert list(fast_item) == list(generic_item)
    assert JSONRenderer().render(fast) == JSONRenderer().render(generic)


@pytest.fixture
def runs(world) -> list[Run]:
    """Runs in every state, with and without cluster, estimates, reasons, attempts."""
    alice = world.researcher_a
    by_state = {}
    for state in RunState:
        by_state[state] = run_submit(
            user=alice, data=experiment_input(world, name=f"run {state.label}")
        )
    queued_plain = run_submit(user=alice, data=experiment_input(world, name="no estimate"))
    admission_run_cycle()  # every run but one gets a cluster and an attempt
    Run.objects.filter(pk=by_state[RunState.QUEUED].pk).update(
        state=RunState.QUEUED,
        cluster=None,
        wait_reason=WaitReason.QUOTA,
        wait_message="Guaranteed quota in use",
        **ESTIMATES,
    )
    Run.objects.filter(pk=queued_plain.pk).update(
        state=RunState.QUEUED, cluster=None, start_note="No run like it has ended yet."
    )
    for attempt in Attempt.objects.filter(run__in=by_state.values()):
        attempt_submit(attempt_id=attempt.pk)
    run_cancel(run=by_state[RunState.CANCELLED], actor=world.tenant_admin_a)  # an actor
    ended = timezone.now() + timedelta(microseconds=7)
    for state, run in by_state.items():
        if state == RunState.QUEUED:
            continue
        Run.objects.filter(pk=run.pk).update(
            state=state,
            borrowed=state in (RunState.RUNNING, RunState.PREEMPTED),
            restarts=2 if state == RunState.FAILED else 0,
            failure_reason=FailureReason.OOM_GPU if state == RunState.FAILED else "",
            started_at=ended - timedelta(hours=1) if state != RunState.ADMITTED else None,
            finished_at=ended if state in (RunState.SUCCEEDED, RunState.FAILED) else None,
            cancel_requested_at=ended if state == RunState.CANCELLED else None,
            **ESTIMATES,  # left from the queue: not shown once it left it
        )
    failed = Attempt.objects.get(run=by_state[RunState.FAILED])
    attempt_report_runtime(
        attempt=failed,
        report={"driver_version": "550.54.15", "framework": {"torch": "2.4.0"}},
    )
    Attempt.objects.filter(pk=failed.pk).update(
        state=AttemptState.FAILED,
        exit_code=137,
        failure_reason=FailureReason.OOM_GPU,
        failure_message="CUDA out of memory",
        node_list=["gpu-001", "gpu-002"],
        gpu_uuids=["GPU-1", "GPU-2"],
        finished_at=ended,
    )
    Attempt.objects.create(
        run=by_state[RunState.FAILED],
        number=2,
        cluster=world.cluster,
        state=AttemptState.LOST,
        placement=["gpu-003"],
    )
    RunEvent.objects.create(
        run=by_state[RunState.FAILED],
        attempt=failed,
        from_state=RunState.RUNNING,
        to_state=RunState.FAILED,
        reason="OOM",
        message="It ran out of GPU memory.",
        admin_detail="Detail for platform admins only.",
    )
    return [*by_state.values(), queued_plain]


VIEWERS = ("researcher_a", "platform_admin")


@pytest.mark.parametrize("viewer_name", VIEWERS)
@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
def test_runs_are_written_as_drf_wrote_them(world, runs, viewer_name, zone):
    viewer = getattr(world, viewer_name)
    with timezone.override(zone):
        page = run_page_viewable(user=viewer, size=50)
        assert {run.state for run in page.runs} == set(RunState)
        for run in page.runs:
            assert_same_output(
                RunSerializer(run).data, run_as_drf_wrote_it(run, detail=False, viewer=viewer)
            )
            shown = run_get_viewable(user=viewer, run_id=run.pk)
            context = {"request": type("Request", (), {"user": viewer})()}
            assert_same_output(
                RunDetailSerializer(shown, context=context).data,
                run_as_drf_wrote_it(shown, detail=True, viewer=viewer),
            )


@pytest.mark.parametrize("datetime_format", ["%d.%m.%Y %H:%M:%S", None])
def test_other_datetime_formats_are_left_to_drf(world, runs, datetime_format):
    rest_framework = {**settings.REST_FRAMEWORK, "DATETIME_FORMAT": datetime_format}
    with override_settings(REST_FRAMEWORK=rest_framework):
        for run in runs:
            shown = run_get_viewable(user=world.researcher_a, run_id=run.pk)
            context = {"request": type("Request", (), {"user": world.researcher_a})()}
            fast = RunDetailSerializer(shown, context=context).data
            assert fast == run_as_drf_wrote_it(shown, detail=True, viewer=world.researcher_a)
            assert list(fast) == list(RunDetailSerializer.Meta.fields)


def test_a_run_just_submitted_is_written_as_drf_wrote_it(world):
    """The spec endpoint writes the run its service returns, not one read back."""
    run = run_submit(user=world.researcher_a, data=experiment_input(world))

    assert_same_output(RunSerializer(run).data, run_as_drf_wrote_it(run, detail=False, viewer=None))
