"""Test settings: the project's settings with defaults for the machine's PostgreSQL and Redis.

``make test`` exports the real values (it may start throwaway servers on other ports).
"""

import os

os.environ.setdefault("GANTRY_EMBEDDED", "1")  # a development secret key is fine in tests
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gantry")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
os.environ.setdefault("GANTRY_DATA_DIR", "/tmp/gantry-test-data")

from portal.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
