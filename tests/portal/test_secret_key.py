"""The embedded mode's secret key: generated on first start from a cryptographic random
source, kept in the data directory (0600), the same on every later start, and one key for
processes that start at once (portal/secret_key.py)."""

import json
import multiprocessing
import os
import re
import stat
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.secret_key import _create, embedded_secret_key
from tests.portal.test_settings_env import load_settings

KEY = re.compile(r"[A-Za-z0-9_-]{86}")
RACERS = 8
ROUNDS = 10


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_first_start_creates_a_random_key_readable_by_its_owner_only(tmp_path):
    # Given an empty data directory and the loosest umask
    data = tmp_path / "data"
    old_umask = os.umask(0)
    try:
        # When the key is asked for twice, and for another data directory
        first = embedded_secret_key(data)
        again = embedded_secret_key(data)
        elsewhere = embedded_secret_key(tmp_path / "other")
    finally:
        os.umask(old_umask)

    # Then one key of 64 random bytes was written with mode 0600 and is read back, and
    # another directory gets another key; no temporary file is left behind
    assert KEY.fullmatch(first)
    assert again == first
    assert elsewhere != first
    assert (data / "secret_key").read_text() == first + "\n"
    assert mode_of(data / "secret_key") == 0o600
    assert sorted(p.name for p in data.iterdir()) == ["secret_key"]


def test_a_process_that_loses_the_race_keeps_the_winners_key(tmp_path):
    # Given the key another process wrote between our look and our create
    key = embedded_secret_key(tmp_path)

    # When our create runs all the same
    _create(tmp_path / "secret_key")

    # Then the file is the winner's, whole, and our candidate is gone
    assert embedded_secret_key(tmp_path) == key
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret_key"]


def _race(data_dir: str, barrier, results) -> None:
    barrier.wait()
    results.put(embedded_secret_key(Path(data_dir)))


def test_processes_starting_at_once_agree_on_one_key(tmp_path):
    # Given RACERS processes released together on a fresh data directory, ROUNDS times
    context = multiprocessing.get_context("fork")
    for round_ in range(ROUNDS):
        data = tmp_path / f"round-{round_}"
        barrier, results = context.Barrier(RACERS), context.Queue()
        racers = [
            context.Process(target=_race, args=(str(data), barrier, results)) for _ in range(RACERS)
        ]
        for racer in racers:
            racer.start()
        keys = [results.get(timeout=30) for _ in racers]
        for racer in racers:
            racer.join(timeout=30)

        # Then every one of them read the same key, the one in the file
        assert [racer.exitcode for racer in racers] == [0] * RACERS
        assert set(keys) == {(data / "secret_key").read_text().strip()}
        assert sorted(p.name for p in data.iterdir()) == ["secret_key"]


def test_the_embedded_settings_use_the_generated_key_on_every_start(tmp_path):
    first = load_settings(tmp_path, GANTRY_EMBEDDED="1")
    second = load_settings(tmp_path, GANTRY_EMBEDDED="1")

    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    key = json.loads(first.stdout)["secret_key"]
    assert KEY.fullmatch(key)
    assert json.loads(second.stdout)["secret_key"] == key
    assert (tmp_path / "data" / "secret_key").read_text().strip() == key


def test_a_key_from_the_environment_wins_and_nothing_is_written(tmp_path):
    result = load_settings(
        tmp_path, GANTRY_EMBEDDED="1", DJANGO_SECRET_KEY="from-the-environment-" + "x" * 40
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["secret_key"] == "from-the-environment-" + "x" * 40
    assert not (tmp_path / "data" / "secret_key").exists()


@pytest.mark.parametrize(
    ("content", "mode", "error"),
    [
        ("k" * 86, 0o640, "is readable by others (mode 640): chmod 600 {path}"),
        ("k" * 86, 0o604, "is readable by others (mode 604): chmod 600 {path}"),
        (
            "short",
            0o600,
            "holds no usable key (5 characters, at least 50): remove it to make a new one "
            "(everybody is logged out)",
        ),
        ("", 0o600, "holds no usable key (0 characters, at least 50): remove it to make a new"),
        ("é" * 86, 0o600, "holds no usable key (0 characters, at least 50): remove it to make"),
    ],
    ids=["group-readable", "world-readable", "short", "empty", "not-ascii"],
)
def test_a_key_file_others_can_read_or_that_holds_no_key_stops_the_start(
    tmp_path, content, mode, error
):
    path = tmp_path / "secret_key"
    path.write_bytes(content.encode("utf-8"))
    path.chmod(mode)

    with pytest.raises(ImproperlyConfigured) as refused:
        embedded_secret_key(tmp_path)

    assert str(refused.value).startswith(f"{path} " + error.format(path=path))
    assert path.read_bytes() == content.encode("utf-8")  # left for the operator to look at


def test_a_key_path_that_is_not_a_file_stops_the_start(tmp_path):
    (tmp_path / "elsewhere").write_text("k" * 86)
    (tmp_path / "secret_key").symlink_to(tmp_path / "elsewhere")

    with pytest.raises(ImproperlyConfigured, match="is not a regular file: remove it"):
        embedded_secret_key(tmp_path)
