"""``{% load estimates %}``: start times as people say them (``13:05``, ``Thu 13:05``)."""

from django import template
from django.utils import timezone

from jobs.selectors.estimates import when

register = template.Library()


@register.filter
def start_time(moment):
    return when(moment, now=timezone.now()) if moment else ""
