"""The largest gangs as the home and nodes pages say them (jobs/templatetags/gangs.py): a size
no node can host is said in words, never as a gang of 0 nodes."""

import pytest

from jobs.selectors.nodes import GangSize
from jobs.templatetags.gangs import gangs_text


def gangs(*pairs: tuple[int, int]) -> tuple[GangSize, ...]:
    return tuple(GangSize(nodes=nodes, gpus_per_node=gpus) for nodes, gpus in pairs)


@pytest.mark.parametrize(
    ("sizes", "style", "shown"),
    [
        (((0, 8), (0, 4), (1, 2), (1, 1)), "", "1 × 2, 1 × 1; no node has 8 or 4 GPUs free"),
        (((1, 8), (2, 4), (2, 2), (2, 1)), "or", "1 × 8, or 2 × 4, 2 × 2, 2 × 1"),
        (((0, 8), (4, 6), (4, 4)), "or", "4 × 6, or 4 × 4; no node has 8 GPUs free"),
        (((0, 8), (0, 4), (0, 2), (0, 1)), "", "no node has 8, 4, 2 or 1 GPUs free"),
        (((0, 1),), "", "no node has 1 GPU free"),
        (((3, 8),), "or", "3 × 8"),
    ],
)
def test_gang_sizes_never_show_a_gang_of_zero_nodes(sizes, style, shown):
    assert gangs_text(gangs(*sizes), style) == shown
    assert "0 ×" not in gangs_text(gangs(*sizes), style)
