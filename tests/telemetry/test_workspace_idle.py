"""The workspace idle verdict (telemetry/workspace_idle.py): in use on any signal, warned,
then suspended after the tenant's threshold; busy kernels are never suspended by default."""

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from telemetry.workspace_idle import (
    IdleAction,
    IdleVerdict,
    WorkspacePolicy,
    WorkspaceSignals,
    idle_verdict,
    last_use,
)

READY = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
POLICY = WorkspacePolicy(suspend_after=timedelta(minutes=60), warn_before=timedelta(minutes=10))


def at(minutes: float) -> datetime:
    return READY + timedelta(minutes=minutes)


def signals(now: float, **moments) -> WorkspaceSignals:
    busy = moments.pop("busy_kernels", 0)
    return WorkspaceSignals(
        now=at(now), ready_at=READY, busy_kernels=busy, **{k: at(v) for k, v in moments.items()}
    )


def test_an_open_tab_with_nothing_running_is_warned_then_suspended_after_the_threshold():
    # (b): the proxy saw the person last at 9:05; JupyterLab's polling is not use.
    seen = {"proxy_activity_at": 5, "kernel_activity_at": 4}
    assert idle_verdict(signals(30, **seen), POLICY, warned_at=None) == IdleVerdict(
        IdleAction.IDLE, at(5), at(65)
    )
    assert idle_verdict(signals(55, **seen), POLICY, warned_at=None) == IdleVerdict(
        IdleAction.WARN, at(5), at(65)
    )
    assert idle_verdict(signals(64, **seen), POLICY, warned_at=at(55)) == IdleVerdict(
        IdleAction.WARN, at(5), at(65)
    )
    assert idle_verdict(signals(65, **seen), POLICY, warned_at=at(55)) == IdleVerdict(
        IdleAction.SUSPEND, at(5), at(65)
    )
    # A server that did not answer this time may be busy: not suspended on that scan.
    unanswered = WorkspaceSignals(at(65), READY, proxy_activity_at=at(5), server_answered=False)
    assert idle_verdict(unanswered, POLICY, warned_at=at(55)) == IdleVerdict(
        IdleAction.WARN, at(5), at(65)
    )


def test_a_missed_warning_moves_the_suspension_never_skips_the_warning():
    seen = {"proxy_activity_at": 5}
    assert idle_verdict(signals(200, **seen), POLICY, warned_at=None) == IdleVerdict(
        IdleAction.WARN, at(5), at(210)
    )
    assert idle_verdict(signals(210, **seen), POLICY, warned_at=at(200)) == IdleVerdict(
        IdleAction.SUSPEND, at(5), at(210)
    )
    # A warning of an earlier streak does not count for this one.
    assert idle_verdict(signals(70, proxy_activity_at=20), POLICY, warned_at=at(3)).action == (
        IdleAction.WARN
    )


def test_a_gpu_active_workspace_with_the_browser_closed_is_in_use():
    # (a): a GPU cell running silently, no tab: DCGM's minute ending now is the evidence.
    assert idle_verdict(
        signals(300, busy_kernels=1, kernel_activity_at=1, gpu_active_at=300),
        POLICY,
        warned_at=None,
    ) == IdleVerdict(IdleAction.IN_USE, None, None)


def test_a_kernel_with_output_is_in_use_and_a_silent_busy_one_is_only_warned_by_default():
    # (d): a CPU-only computation printing progress.
    assert idle_verdict(
        signals(300, busy_kernels=1, kernel_activity_at=299.5), POLICY, warned_at=None
    ) == IdleVerdict(IdleAction.IDLE, at(299.5), at(359.5), silent_busy=True)
    # (c): busy, no output and no GPU use for hours: warned, never suspended...
    silent = signals(300, busy_kernels=1, kernel_activity_at=10)
    assert idle_verdict(silent, POLICY, warned_at=at(60)) == IdleVerdict(
        IdleAction.WARN, at(10), None, silent_busy=True
    )
    # ... unless the tenant says so.
    strict = WorkspacePolicy(timedelta(minutes=60), timedelta(minutes=10), suspend_silent_busy=True)
    assert idle_verdict(silent, strict, warned_at=at(60)) == IdleVerdict(
        IdleAction.SUSPEND, at(10), at(70), silent_busy=True
    )


def test_nothing_is_idle_before_the_server_came_up_and_no_signal_is_no_evidence():
    assert last_use(signals(30)) == READY
    assert idle_verdict(signals(0), POLICY, warned_at=None) == IdleVerdict(
        IdleAction.IN_USE, None, None
    )
    # Evidence from the future (clock skew of a node) is read as now.
    assert last_use(signals(30, gpu_active_at=31)) == at(30)


@given(
    minutes=st.lists(st.none() | st.integers(0, 600), min_size=4, max_size=4),
    now=st.integers(0, 900),
    warned=st.none() | st.integers(0, 900),
    silent_policy=st.booleans(),
    answered=st.booleans(),
)
def test_never_suspended_before_the_threshold_after_the_last_use_nor_unwarned(
    minutes, now, warned, silent_policy, answered
):
    names = ("kernel_activity_at", "terminal_activity_at", "proxy_activity_at", "gpu_active_at")
    moments = {
        name: m for name, m in zip(names, minutes, strict=True) if m is not None and m <= now
    }
    observed = WorkspaceSignals(
        at(now), READY, server_answered=answered, **{k: at(v) for k, v in moments.items()}
    )
    policy = WorkspacePolicy(timedelta(minutes=60), timedelta(minutes=10), silent_policy)
    warned_at = None if warned is None or warned > now else at(warned)
    verdict = idle_verdict(observed, policy, warned_at=warned_at)
    if verdict.action == IdleAction.SUSPEND:
        assert observed.now - last_use(observed) >= timedelta(minutes=60)
        assert warned_at is not None and observed.now - warned_at >= timedelta(minutes=10)
        assert answered


def test_a_warning_from_the_scan_just_before_the_warning_time_counts_for_the_streak():
    seen = {"proxy_activity_at": 5}  # warned from 9:55, suspended from 10:05
    assert idle_verdict(signals(64, **seen), POLICY, warned_at=at(54)) == IdleVerdict(
        IdleAction.WARN, at(5), at(65)
    )
    assert idle_verdict(signals(65, **seen), POLICY, warned_at=at(54)) == IdleVerdict(
        IdleAction.SUSPEND, at(5), at(65)
    )
    # A minute and more before: another streak's.
    assert idle_verdict(signals(65, **seen), POLICY, warned_at=at(53.9)).action == IdleAction.WARN


def test_a_silent_busy_kernel_the_tenant_suspends_is_warned_as_such_first():
    strict = WorkspacePolicy(timedelta(minutes=60), timedelta(minutes=10), suspend_silent_busy=True)
    silent = signals(55, busy_kernels=1, kernel_activity_at=5)
    assert idle_verdict(silent, strict, warned_at=None) == IdleVerdict(
        IdleAction.WARN, at(5), at(65), silent_busy=True
    )
