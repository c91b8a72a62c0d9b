"""Where the CLI keeps its credentials: ``$GANTRY_CONFIG_DIR/credentials.json``, else
``~/.config/gantry/credentials.json``; the file is 0600, its directory 0700."""

import json
import os
from dataclasses import dataclass
from pathlib import Path

CREDENTIALS_FILE = "credentials.json"


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str

    def __repr__(self) -> str:  # the token must never reach a log or a traceback
        return f"Credentials(url={self.url!r}, token='***')"


def config_dir() -> Path:
    configured = os.environ.get("GANTRY_CONFIG_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "gantry"


def credentials_path() -> Path:
    return config_dir() / CREDENTIALS_FILE


def credentials_load() -> Credentials | None:
    """The stored credentials, or None if there are none or they are unreadable."""
    try:
        data = json.loads(credentials_path().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    url, token = data.get("url"), data.get("token")
    if not isinstance(url, str) or not isinstance(token, str) or not url or not token:
        return None
    return Credentials(url=url, token=token)


def credentials_save(credentials: Credentials) -> Path:
    """Write the file atomically: a temporary file created 0600 (never readable by others,
    not even for a moment), then renamed over the old one."""
    directory = config_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / CREDENTIALS_FILE
    temporary = directory / f".{CREDENTIALS_FILE}.{os.getpid()}.tmp"
    body = json.dumps({"url": credentials.url, "token": credentials.token}).encode()
    temporary.unlink(missing_ok=True)  # left by a crashed run with the same process id
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(body)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def credentials_delete() -> bool:
    try:
        credentials_path().unlink()
    except FileNotFoundError:
        return False
    return True
