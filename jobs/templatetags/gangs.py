"""``{% load gangs %}``: the largest gangs that could start now, as people read them.

A size no node can host is said in words ("no node has 8 GPUs free"), never as a gang of
0 nodes ("0 × 8"), which reads as if such a gang existed.
"""

from django import template

register = template.Library()


def _alternatives(numbers: list[int]) -> str:
    words = [str(number) for number in numbers]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


@register.filter
def gangs_text(gangs, style: str = "") -> str:
    """Each size that could start now as "nodes × GPUs per node" (largest per node first),
    then the sizes no node can host in one clause. ``style="or"`` says the sizes are
    alternatives: "1 × 8, or 2 × 4, 2 × 2"."""
    possible = [f"{gang.nodes} × {gang.gpus_per_node}" for gang in gangs if gang.nodes]
    impossible = [gang.gpus_per_node for gang in gangs if not gang.nodes]
    parts = []
    if possible:
        first, *rest = possible
        parts.append(
            ", or ".join([first, ", ".join(rest)])
            if rest and style == "or"
            else ", ".join(possible)
        )
    if impossible:
        plural = "" if impossible == [1] else "s"
        parts.append(f"no node has {_alternatives(impossible)} GPU{plural} free")
    return "; ".join(parts)
