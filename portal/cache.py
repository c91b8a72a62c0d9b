"""Django's database cache, safe for several processes on PostgreSQL too.

Django's ``DatabaseCache.add`` reads the row and then inserts or, when the stored entry has
expired, updates it. Two processes adding the same expired key on PostgreSQL could both
update it and both be told they added it; the API's throttles count on ``add`` being a
claim (``tenants.throttling``). Each write here first takes a transaction-scoped advisory
lock on the key, so writes of one key happen one after the other. SQLite needs no lock:
Gantry's SQLite transactions are IMMEDIATE, so writers already take turns.
"""

import zlib

from django.core.cache.backends.db import DatabaseCache as DjangoDatabaseCache
from django.db import connections, router, transaction

# High 32 bits of the advisory lock key: the cache's own namespace (the admission cycle
# uses a different key).
_LOCK_NAMESPACE = 0x67636163  # "gcac"


class DatabaseCache(DjangoDatabaseCache):
    # Private in Django (and missing from django-stubs), stable since Django 1.x.
    def _base_set(self, mode, key, value, timeout=None):
        db = router.db_for_write(self.cache_model_class)
        connection = connections[db]
        if connection.vendor != "postgresql":
            return super()._base_set(mode, key, value, timeout)  # type: ignore[misc]
        with transaction.atomic(using=db):
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s)",
                    [(_LOCK_NAMESPACE << 32) | zlib.crc32(key.encode())],
                )
            return super()._base_set(mode, key, value, timeout)  # type: ignore[misc]
