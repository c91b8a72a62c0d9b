"""How a what-if report's figures read: durations in their unit, and signed changes."""

from django import template

from jobs.replay_report import duration

register = template.Library()


@register.filter
def queue_time(seconds: float | None) -> str:
    """ "40 s", "12 min", "3.5 h", "2.0 d"; "—" for no runs."""
    return duration(seconds)


@register.filter
def signed_duration(seconds: float | None) -> str:
    """A change of a queue time: "+12 min", "−40 s", "±0 s"; "—" when a side has no runs."""
    if seconds is None:
        return "—"
    if seconds == 0:
        return "±0 s"
    return f"{'+' if seconds > 0 else '−'}{duration(abs(seconds))}"


@register.filter
def signed(value: float | int | None, places: int = 1) -> str:
    """A change of a count or of hours: "+3", "−12.5", "±0"."""
    if value is None:
        return "—"
    shown = f"{abs(value):,.{places}f}" if isinstance(value, float) else f"{abs(value):,}"
    if float(shown.replace(",", "")) == 0:
        return "±0"
    return f"{'+' if value > 0 else '−'}{shown}"


@register.filter
def absolute(value: int) -> int:
    """How many nodes a change adds or removes, whatever its sign."""
    return abs(value)
