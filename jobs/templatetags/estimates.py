"""``{% load estimates %}``: start times as people say them (``13:05``, ``Thu 13:05``)."""

from django import template
from django.utils import timezone

from jobs.selectors.estimates import when

register = template.Library()


@register.filter
def start_time(moment):
    """A start estimate as people say it; one stored before now reads as now, never past."""
    if not moment:
        return ""
    now = timezone.now()
    return when(max(moment, now), now=now)
