from django import template

from clusters.backends import spec_for_people

register = template.Library()


@register.filter
def readable_spec(attempt) -> str:
    """The attempt's stored backend spec as a person reads it (Kubernetes: YAML)."""
    return spec_for_people(attempt.cluster.backend, attempt.rendered_spec)
