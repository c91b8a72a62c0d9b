"""Slurm's compressed host lists: ``gpu-node[1-2]`` → ``gpu-node1``, ``gpu-node2``. Pure."""

import re


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list, expanded: ``gpu-node[1-3,7]``, ``n[01-02]-ib``,
    ``rack[1-2]-n[1-2]`` (every combination), several comma-separated at the top level."""
    hostlist = (hostlist or "").strip()
    if hostlist in ("", "(null)", "None", "None assigned"):
        return []
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in hostlist:
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0:
            raise ValueError(f"unbalanced brackets in host list {hostlist!r}")
        current.append(char)
    if depth:
        raise ValueError(f"unbalanced brackets in host list {hostlist!r}")
    parts.append("".join(current))
    hosts: list[str] = []
    for part in parts:
        if part:
            hosts.extend(_expand_one(part))
    return hosts


def _expand_one(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if match is None:
        return [pattern]
    prefix, suffix = pattern[: match.start()], pattern[match.end() :]
    values: list[str] = []
    for item in match.group(1).split(","):
        low, dash, high = item.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"bad range {item!r} in host list {pattern!r}")
        width = len(low)
        stop = int(high) if dash else int(low)
        if stop < int(low) or stop - int(low) > 100_000:
            raise ValueError(f"bad range {item!r} in host list {pattern!r}")
        values.extend(str(n).zfill(width) for n in range(int(low), stop + 1))
    return [host for value in values for host in _expand_one(f"{prefix}{value}{suffix}")]
