from django import template

from jobs.attribution import cause_words

register = template.Library()


@register.filter
def attempt_cause(attempt) -> str:
    """Whose fault the attempt's end was, in a researcher's words ("" for none)."""
    return cause_words(attempt.cause_class, attempt.cause_evidence or {})
