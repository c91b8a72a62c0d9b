"""The embedded mode's secret key: generated on first start, kept in the data directory.

Never a constant in the code: a key anyone can read from the source signs sessions and
password-reset links anyone could forge. Production takes ``DJANGO_SECRET_KEY`` instead.
"""

import contextlib
import os
import secrets
import stat
import tempfile
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

SECRET_KEY_FILE = "secret_key"  # noqa: S105 (a file name)
# 64 random bytes: 86 characters of base64url, past Django's 50-character check.
SECRET_KEY_BYTES = 64
MIN_KEY_LENGTH = 50


def embedded_secret_key(data_dir: Path) -> str:
    """The key kept in ``data_dir/secret_key``, created on first use from the operating
    system's random source, readable by its owner only (0600).

    Processes that start at once agree on one key: the file appears whole or not at all.
    Each writes its candidate to a private temporary file (created exclusively, 0600) and
    hard-links it to the final name, which fails when the name exists; every process then
    reads the one file that won."""
    path = data_dir / SECRET_KEY_FILE
    if not os.path.lexists(path):
        _create(path)
    return _read(path)


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, candidate = tempfile.mkstemp(dir=path.parent, prefix=f".{SECRET_KEY_FILE}.")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_urlsafe(SECRET_KEY_BYTES) + "\n")
            file.flush()
            os.fsync(file.fileno())
        # Fails when another process got there first: its key is the key.
        with contextlib.suppress(FileExistsError):
            os.link(candidate, path)
    finally:
        os.unlink(candidate)


def _read(path: Path) -> str:
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ImproperlyConfigured(f"{path} is not a regular file: remove it to make a new key")
    if info.st_mode & 0o077:
        raise ImproperlyConfigured(
            f"{path} is readable by others (mode {stat.S_IMODE(info.st_mode):o}): chmod 600 {path}"
        )
    try:
        key = path.read_text(encoding="ascii").strip()
    except UnicodeDecodeError:
        key = ""  # not a key this module wrote
    if len(key) < MIN_KEY_LENGTH:
        raise ImproperlyConfigured(
            f"{path} holds no usable key ({len(key)} characters, at least {MIN_KEY_LENGTH}): "
            "remove it to make a new one (everybody is logged out)"
        )
    return key
