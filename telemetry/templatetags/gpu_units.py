"""``{% load gpu_units %}``: GPU time and shares in the unit that makes them readable.

A startup of 14 GPU-seconds is "14 GPU-s", not "0.00" GPU-hours; a share of 0.03 % is
"<0.1 %", not "0.0 %". Zero stays zero.
"""

from django import template

register = template.Library()

SECONDS_PER_MINUTE = 60
SECONDS_PER_HOUR = 3600
# Below a tenth of a GPU-hour two places of hours say too little ("0.04"): minutes instead.
HOURS_FROM_S = SECONDS_PER_HOUR // 10


@register.filter
def gpu_time(gpu_seconds) -> str:
    """GPU-seconds as GPU-hours (2 places) from a tenth of a GPU-hour up, GPU-minutes
    (1 place) from one GPU-minute up, whole GPU-seconds below that."""
    if gpu_seconds is None or gpu_seconds == "":
        return ""
    seconds = float(gpu_seconds)
    if seconds == 0:
        return "0 GPU-h"
    if seconds >= HOURS_FROM_S:
        return f"{seconds / SECONDS_PER_HOUR:,.2f} GPU-h"
    if seconds >= SECONDS_PER_MINUTE:
        return f"{seconds / SECONDS_PER_MINUTE:.1f} GPU-min"
    if seconds < 0.5:
        return "<1 GPU-s"
    return f"{seconds:.0f} GPU-s"


@register.filter
def share_percent(percent, places: int = 1) -> str:
    """A share of a whole to ``places`` places; a non-zero share too small for them reads
    "<0.1 %" (or "<1 %" with no places), never as zero."""
    if percent is None or percent == "":
        return "—"
    value, places = float(percent), int(places)
    shown = f"{value:.{places}f}"
    if value > 0 and float(shown) == 0:
        return f"<{10.0**-places:.{places}f} %"
    return f"{shown} %"


@register.filter
def mostly(items, case: str = "") -> str:
    """What most of something is, from the items that lead it (each with a ``label``): "mostly
    idle" for one, "idle and lost work equally" for a tie, so a 1-to-1 tie is never called
    "mostly" one of them. ``case="lower"`` lowers the labels."""
    labels = [item.label.lower() if case == "lower" else item.label for item in items]
    if not labels:
        return ""
    if len(labels) == 1:
        return f"mostly {labels[0]}"
    return f"{', '.join(labels[:-1])} and {labels[-1]} equally"
