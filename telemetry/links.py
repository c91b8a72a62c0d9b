"""What an attempt's GPUs and links showed over its life (issue 36, point 3): each GPU's SM
clock against its maximum and its NVLink traffic, each node's InfiniBand traffic and error
growth; and the rules that call traffic low or a link erring. Pure: plain data in and out.
``telemetry.selectors.evidence`` reads them; docs/telemetry-sources.md, "Clocks and links",
says where the signals come from.

- **Errors**: a node's InfiniBand link errs when its error counters (symbol errors, link
  error recoveries, links downed, receive errors) grew at all during the attempt:
  ``LINK_ERRORS_MIN`` = 1, the default threshold of ``ibqueryerrors`` (infiniband-diags),
  which reports any port error counter above zero. A healthy link's counters stay still;
  FEC corrects the raw bit errors below them.
- **Low traffic**: in data-parallel training every node (and every GPU) moves the same
  gradients each step, so their traffic rates are close. A node's (a GPU's) mean rate below
  ``LOW_TRAFFIC_SHARE`` of the median of the gang's others is low: a link that trained at a
  lower width or speed, or a rank that communicates less because it is late. Traffic is
  compared within the gang, never with an absolute rate, which depends on the model, the
  batch and the fabric. One node (GPU) alone, or a median of 0, compares with nothing.
"""

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

LINK_ERRORS_MIN = 1
LOW_TRAFFIC_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class GpuClock:
    """One GPU's SM clock over the period: the mean of its minutes' means, and its maximum
    SM clock (``DCGM_FI_DEV_MAX_SM_CLOCK``); None when DCGM did not report them."""

    host: str
    gpu: str
    sm_clock_mhz: float | None
    max_sm_clock_mhz: float | None
    minutes: int  # minutes with an SM clock reading

    @property
    def share(self) -> float | None:
        """The SM clock as a share of the maximum (below ~0.9: a cap or a throttle)."""
        if self.sm_clock_mhz is None or not self.max_sm_clock_mhz:
            return None
        return self.sm_clock_mhz / self.max_sm_clock_mhz


@dataclass(frozen=True, slots=True)
class GpuLink:
    """One GPU's mean NVLink traffic (transmitted + received, bytes/s) over the period."""

    host: str
    gpu: str
    nvlink_bytes_s: float | None
    minutes: int  # minutes with an NVLink reading


@dataclass(frozen=True, slots=True)
class HostLink:
    """One node's InfiniBand ports over the period: mean traffic (transmitted + received,
    bytes/s, all ports) and the growth of their error counters."""

    host: str
    ib_bytes_s: float | None
    ib_errors: int
    minutes: int  # minutes with node exporter samples; 0: the signal is missing

    @property
    def erring(self) -> bool:
        return self.ib_errors >= LINK_ERRORS_MIN


@dataclass(frozen=True, slots=True)
class LinkEvidence:
    gpus: tuple[GpuLink, ...]
    hosts: tuple[HostLink, ...]

    def low_nvlink(self) -> list[GpuLink]:
        """The GPUs whose NVLink traffic is low against the gang's others."""
        return low_traffic(self.gpus, lambda gpu: gpu.nvlink_bytes_s)

    def low_infiniband(self) -> list[HostLink]:
        """The nodes whose InfiniBand traffic is low against the gang's others."""
        return low_traffic(self.hosts, lambda host: host.ib_bytes_s)

    def erring_hosts(self) -> list[HostLink]:
        return [host for host in self.hosts if host.erring]


Item = TypeVar("Item")


def low_traffic(items: Iterable[Item], rate: Callable[[Item], float | None]) -> list[Item]:
    """Those of ``items`` whose ``rate`` is below ``LOW_TRAFFIC_SHARE`` of the median of the
    others' rates (items without a rate neither count nor compare), in their order."""
    known = [(item, value) for item in items if (value := rate(item)) is not None]
    ordered = sorted(value for _, value in known)
    return [
        item
        for item, value in known
        if len(ordered) > 1 and value < LOW_TRAFFIC_SHARE * _median_without(ordered, value)
    ]


def _median_without(ordered: Sequence[float], value: float) -> float:
    """The median of sorted ``ordered`` with one ``value`` taken out, in O(log n): a gang of
    1,024 GPUs is compared without 1,024 sorts."""
    gone = bisect_left(ordered, value)

    def kept(k: int) -> float:
        return ordered[k] if k < gone else ordered[k + 1]

    count = len(ordered) - 1
    middle = count // 2
    return kept(middle) if count % 2 else (kept(middle - 1) + kept(middle)) / 2
