"""GPU counts in what Slurm prints as TRES (``gres/gpu:a100=8``) and GRES (``gpu:a100:8``).

Pure: no Django, no processes.
"""

import re
from collections import defaultdict


def parse_tres(text: str) -> dict[str, str]:
    """``cpu=2,node=2,gres/gpu=16,gres/gpu:a100=16`` → a dict."""
    items = {}
    for part in (text or "").split(","):
        key, eq, value = part.partition("=")
        if eq and key:
            items[key.strip()] = value.strip()
    return items


def gpus_of_tres(text: str) -> int | None:
    tres = parse_tres(text)
    if "gres/gpu" in tres:
        return tres_count(tres["gres/gpu"])
    typed = [tres_count(v) for k, v in tres.items() if k.startswith("gres/gpu:")]
    return sum(typed) if typed else None


def tres_count(value: str) -> int:
    # TRES counts may carry a unit suffix (mem=4000M); GPU counts never do, but be lenient.
    digits = re.match(r"^\d+", value)
    return int(digits.group()) if digits else 0


def parse_gres(gres: str) -> dict[str, int]:
    """``gpu:a100:8(S:0-1),gpu:h100:4`` → ``{"a100": 8, "h100": 4}``; untyped under ``""``."""
    counts: dict[str, int] = defaultdict(int)
    for item in re.split(r",(?![^(]*\))", gres or ""):
        item = re.sub(r"\(.*\)$", "", item.strip())
        parts = item.split(":")
        if not parts or parts[0] != "gpu":
            continue
        if len(parts) == 2 and parts[1].isdigit():
            counts[""] += int(parts[1])
        elif len(parts) >= 3 and parts[-1].isdigit():
            counts[parts[1]] += int(parts[-1])
        elif len(parts) == 2:
            counts[parts[1]] += 1
    return dict(counts)


def gpus_per_node_of(tres_per_node: str) -> dict[str, int]:
    """A job's TRES per node as GPUs by type: ``gres:gpu:a100:4`` (22.05) or
    ``gres/gpu:a100=4`` (23.02 on) → ``{"a100": 4}``; untyped under ``""``."""
    items = [re.sub(r"^gres[:/]", "", item.strip()) for item in (tres_per_node or "").split(",")]
    return parse_gres(",".join(item.replace("=", ":") for item in items))


def gpus_of_alloc_tres(text: str) -> dict[str, int]:
    """A node's ``AllocTRES`` (``cpu=1,gres/gpu=6,gres/gpu:a100=6``) as GPUs by type."""
    tres = parse_tres(text)
    typed = {
        k.removeprefix("gres/gpu:"): tres_count(v) for k, v in tres.items() if "gres/gpu:" in k
    }
    if typed:
        return typed
    return {"": tres_count(tres["gres/gpu"])} if "gres/gpu" in tres else {}
