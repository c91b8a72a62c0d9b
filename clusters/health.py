"""Node health's vocabulary and NVIDIA's meaning of each signal (design §10). Pure: no ORM,
no clock.

A *signal* is one observation about a node or one of its GPUs (an XID, an ECC counter that
grew, a throttle reason, the backend's node state, a GPU missing from the inventory, attempts
failing there, a health check's result). Each falls in one *class*; a cluster's policy says
per class what Gantry does about it: observe (record only), warn (the node becomes suspect:
shown, still placed on) or quarantine (no new work; pushed to the backend as a drain or a
cordon and taint).

The XID table follows NVIDIA's Xid catalog resolution buckets as NVIDIA's own NVSentinel
carries them (``gpu-health-monitor/xiderrorsmapping.csv``) and DCGM 4.6's health watches
(``modules/health/DcgmHealthWatch.cpp``); docs/node-health.md cites each source. Where they
disagree, the catalog's bucket decides the action, not DCGM's label.
"""

from dataclasses import dataclass
from enum import StrEnum


class NodeHealth(StrEnum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"  # warned about: shown to admins, still placed on
    QUARANTINED = "quarantined"  # no new work; its runs leave as the policy says


class Action(StrEnum):
    """What the policy does about a signal of a class, mildest first."""

    OBSERVE = "observe"
    WARN = "warn"
    QUARANTINE = "quarantine"


class SignalClass(StrEnum):
    """Every class a signal falls in; a policy sets an action per class."""

    # DCGM, hardware: the GPU or node needs a reset, a reboot or a repair.
    ECC_UNCORRECTABLE = "ecc_uncorrectable"  # double-bit / uncontained ECC (XID 48, 95, 140)
    ROW_REMAP_FAILURE = "row_remap_failure"  # memory repair failed (XID 64, DCGM field 395)
    GPU_LOST = "gpu_lost"  # fallen off the bus (XID 79), or missing from the inventory
    NVLINK = "nvlink"  # NVLink errors the driver reports as fatal (XID 74, 144-150)
    GPU_RESET_NEEDED = "gpu_reset_needed"  # GSP / micro-controller / init (XID 62, 119, 120…)
    # DCGM, degraded but working.
    ECC_PAGE_RETIREMENT = "ecc_page_retirement"  # pages retired / rows remapped (XID 63)
    THERMAL_THROTTLE = "thermal_throttle"  # clock event reasons SW/HW thermal
    POWER_THROTTLE = "power_throttle"  # clock event reasons SW power cap, HW power brake
    PCIE_REPLAY = "pcie_replay"  # PCIe replay counter growing
    # NVLink CRC / replay / recovery counters growing: the link retried and recovered (a
    # link getting worse, worth a look; not a fault the job died of, unlike XID 74).
    NVLINK_ERRORS = "nvlink_errors"
    # XIDs that say nothing about the hardware (the catalog: restart the application).
    XID_APPLICATION = "xid_application"
    XID_UNKNOWN = "xid_unknown"  # a code not in the table: recorded, no action by default
    # The backend and the inventory.
    NODE_DOWN = "node_down"  # Slurm DOWN/FAIL/NOT_RESPONDING, Kubernetes Ready not True
    NODE_CONDITION = "node_condition"  # a GPU condition set on the node (NPD, NVSentinel)
    # The job side and the active check.
    ATTEMPT_FAILURES = "attempt_failures"  # attempts of several tenants failing on the node
    # Ranks on the node flagged as stragglers (a slow GPU, or no cause found) in several
    # runs within the policy's window (telemetry.straggler_flags): slow, not broken.
    SLOW_RANKS = "slow_ranks"
    HEALTH_CHECK_FAILED = "health_check_failed"


# Classes whose signal on an attempt's node or GPU during the attempt makes its end the
# hardware's fault (jobs attribute ended attempts from these).
HARDWARE_CLASSES = frozenset(
    {
        SignalClass.ECC_UNCORRECTABLE,
        SignalClass.ROW_REMAP_FAILURE,
        SignalClass.GPU_LOST,
        SignalClass.NVLINK,
        SignalClass.GPU_RESET_NEEDED,
        SignalClass.NODE_DOWN,
        SignalClass.NODE_CONDITION,
        SignalClass.HEALTH_CHECK_FAILED,
    }
)

# The default policy: what each class does when a cluster's policy does not say.
DEFAULT_ACTIONS: dict[SignalClass, Action] = {
    SignalClass.ECC_UNCORRECTABLE: Action.QUARANTINE,  # one double-bit error quarantines
    SignalClass.ROW_REMAP_FAILURE: Action.QUARANTINE,
    SignalClass.GPU_LOST: Action.QUARANTINE,
    SignalClass.NVLINK: Action.QUARANTINE,
    SignalClass.GPU_RESET_NEEDED: Action.QUARANTINE,
    SignalClass.ECC_PAGE_RETIREMENT: Action.OBSERVE,
    SignalClass.THERMAL_THROTTLE: Action.WARN,
    SignalClass.POWER_THROTTLE: Action.OBSERVE,
    SignalClass.PCIE_REPLAY: Action.WARN,
    SignalClass.NVLINK_ERRORS: Action.WARN,
    SignalClass.XID_APPLICATION: Action.OBSERVE,
    SignalClass.XID_UNKNOWN: Action.OBSERVE,
    SignalClass.NODE_DOWN: Action.WARN,  # the backend takes no work there itself already
    SignalClass.NODE_CONDITION: Action.QUARANTINE,
    SignalClass.ATTEMPT_FAILURES: Action.WARN,  # suspect: two or more tenants, one window
    # Suspect: a node slow for several runs is a lemon candidate worth a person's look (and a
    # health check), not proof of a fault: the slowness may be the runs' own.
    SignalClass.SLOW_RANKS: Action.WARN,
    SignalClass.HEALTH_CHECK_FAILED: Action.QUARANTINE,
}


class Source(StrEnum):
    """Where a signal came from."""

    DCGM = "dcgm"
    BACKEND = "backend"
    INVENTORY = "inventory"
    ATTEMPTS = "attempts"
    HEALTH_CHECK = "health_check"


@dataclass(frozen=True, slots=True)
class Xid:
    code: int
    mnemonic: str  # NVIDIA's (NVSentinel's copy of the catalog)
    description: str  # dcgm-exporter's text of the catalog
    resolution: str  # the catalog's immediate-action bucket
    signal: SignalClass


# The XIDs a platform acts on, and the application ones named so they are not "unknown".
XIDS: dict[int, Xid] = {
    x.code: x
    for x in (
        Xid(8, "GPU_TIMEOUT", "GPU stopped processing", "RESTART_APP", SignalClass.XID_APPLICATION),
        Xid(13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP",
            SignalClass.XID_APPLICATION),
        Xid(31, "FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP",
            SignalClass.XID_APPLICATION),
        Xid(43, "RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE",
            SignalClass.XID_APPLICATION),
        Xid(45, "PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors",
            "WORKFLOW_XID_45", SignalClass.XID_APPLICATION),
        Xid(46, "GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU",
            SignalClass.GPU_RESET_NEEDED),
        Xid(48, "GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48",
            SignalClass.ECC_UNCORRECTABLE),
        Xid(61, "PMU_BREAKPOINT", "Internal micro-controller breakpoint/warning",
            "UNEXPECTED_ERR_REPORT_ISSUE", SignalClass.GPU_RESET_NEEDED),
        Xid(62, "PMU_HALT_ERROR", "Internal micro-controller halt", "RESET_GPU",
            SignalClass.GPU_RESET_NEEDED),
        Xid(63, "INFOROM_DRAM_RETIREMENT_EVENT",
            "ECC page retirement or row remapping recording event", "IGNORE",
            SignalClass.ECC_PAGE_RETIREMENT),
        Xid(64, "INFOROM_DRAM_RETIREMENT_FAILURE",
            "ECC page retirement or row remapper recording failure", "RESET_GPU",
            SignalClass.ROW_REMAP_FAILURE),
        Xid(68, "NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP", SignalClass.XID_APPLICATION),
        Xid(69, "GR_CLASS_ERROR", "Graphics Engine class error", "RESTART_APP",
            SignalClass.XID_APPLICATION),
        Xid(74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR", SignalClass.NVLINK),
        Xid(79, "GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM",
            SignalClass.GPU_LOST),
        Xid(92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE",
            SignalClass.ECC_PAGE_RETIREMENT),
        Xid(94, "CONTAINED_ERROR", "Contained ECC error", "RESTART_APP",
            SignalClass.XID_APPLICATION),
        Xid(95, "UNCONTAINED_ERROR", "Uncontained ECC error", "RESET_GPU",
            SignalClass.ECC_UNCORRECTABLE),
        Xid(109, "CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU",
            SignalClass.GPU_RESET_NEEDED),
        Xid(119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU", SignalClass.GPU_RESET_NEEDED),
        Xid(120, "GSP_ERROR", "GSP Error", "RESET_GPU", SignalClass.GPU_RESET_NEEDED),
        Xid(121, "C2C_ERROR", "C2C Link Error", "IGNORE", SignalClass.XID_APPLICATION),
        Xid(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "Unrecovered ECC Error", "RESET_GPU",
            SignalClass.ECC_UNCORRECTABLE),
        Xid(143, "GPU_INIT_ERROR", "GPU Initialization Failure", "RESET_GPU",
            SignalClass.GPU_RESET_NEEDED),
        *(
            Xid(code, f"NVLINK5_{name}", f"NVLINK: {name} Error", "WORKFLOW_NVLINK5_ERR",
                SignalClass.NVLINK)
            for code, name in zip(
                range(144, 151), ("SAW", "RLW", "TLW", "TREX", "NVLPW_CTRL", "NETIR", "MSE"),
                strict=True,
            )
        ),
    )
}  # fmt: skip


def xid_class(code: int) -> SignalClass:
    """The class of an XID code; a code nobody knows is XID_UNKNOWN (no action by default)."""
    xid = XIDS.get(code)
    return SignalClass.XID_UNKNOWN if xid is None else xid.signal


# DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits (dcgm_fields.h, 1:1 with NVML).
CLOCK_EVENT_SW_POWER_CAP = 0x004
CLOCK_EVENT_HW_SLOWDOWN = 0x008
CLOCK_EVENT_SW_THERMAL = 0x020
CLOCK_EVENT_HW_THERMAL = 0x040
CLOCK_EVENT_HW_POWER_BRAKE = 0x080
THERMAL_BITS = CLOCK_EVENT_SW_THERMAL | CLOCK_EVENT_HW_THERMAL
POWER_BITS = CLOCK_EVENT_SW_POWER_CAP | CLOCK_EVENT_HW_POWER_BRAKE


def throttle_classes(reasons: int) -> tuple[SignalClass, ...]:
    """The throttle classes a clock-event-reasons bitmask shows (HW slowdown counts as
    thermal: NVIDIA's text names temperature first among its causes)."""
    found = []
    if reasons & (THERMAL_BITS | CLOCK_EVENT_HW_SLOWDOWN):
        found.append(SignalClass.THERMAL_THROTTLE)
    if reasons & POWER_BITS:
        found.append(SignalClass.POWER_THROTTLE)
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Signal:
    """One observation about a node (``gpu`` empty) or one of its GPUs (its index)."""

    node: str
    signal: SignalClass
    source: Source
    at: float  # Unix seconds, as the source stamped it
    gpu: str = ""
    code: str = ""  # the XID, the counter or condition name, the backend state
    detail: str = ""  # a sentence for a person: "XID 79 GPU has fallen off the bus"
