"""Rate limits that hold across processes and hosts, counted in the shared cache.

A limit of N requests per window W is N *slots* in the cache, each a key that lives W
seconds. A request is allowed when it claims a free slot with ``cache.add`` (Redis: SET NX;
the database cache: one writer per key), and refused when all N are taken. A slot claimed at
time s is held until s + W, so any W seconds hold at most N allowed requests, whichever web
worker served them: a sliding window, with no read-modify-write to race.
"""

import hashlib
import math
from dataclasses import dataclass

from django.core.cache import cache
from django.utils import timezone


@dataclass(frozen=True)
class Limit:
    requests: int
    window_s: int


def claim(*, scope: str, ident: str, limit: Limit, now: float | None = None) -> float | None:
    """Count one request of ``ident`` against ``limit``: None if it is allowed, else the
    seconds until a slot frees."""
    now = timezone.now().timestamp() if now is None else now
    # Hashed: an ident may hold spaces and control characters, which some caches refuse.
    digest = hashlib.sha256(ident.encode()).hexdigest()
    keys = [f"throttle:{scope}:{digest}:{slot}" for slot in range(limit.requests)]
    # A slot's key outlives its claim by up to a second (whole-second expiry); the value is
    # the claim's own time, which is what Retry-After is computed from.
    timeout = math.ceil(limit.window_s)
    for key in keys:
        if cache.add(key, now, timeout=timeout):
            return None
    claimed = [at for at in cache.get_many(keys).values() if isinstance(at, int | float)]
    if not claimed:
        return 1.0  # every slot expired between the claims and this read: try again
    return max(1.0, min(claimed) + limit.window_s - now)
