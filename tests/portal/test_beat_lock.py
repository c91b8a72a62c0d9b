"""The beat leader lock (portal/beat_lock.py) on the real Redis and on real file locks, and
the leadership it decides, with the clock moved by the test."""

import subprocess
import sys
import uuid

import pytest
import redis
from django.conf import settings

from portal.beat_lock import (
    FileBeatLock,
    Leadership,
    LockUnreachable,
    RedisBeatLock,
    beat_lock,
    lock_where,
)
from tests.celery_support import free_port, wait_for


@pytest.fixture
def client():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def prefix(client):
    prefix = f"gantry-test:{uuid.uuid4().hex}:beat"
    yield prefix
    client.delete(f"{prefix}:leader", f"{prefix}:last-run")


def redis_lock(client, prefix, *, ttl_s=30.0, token=None):
    return RedisBeatLock(client, key_prefix=prefix, ttl_s=ttl_s, token=token)


# --- Redis ---------------------------------------------------------------------------------


def test_one_beat_at_a_time_takes_the_redis_lock(client, prefix):
    first, second = redis_lock(client, prefix, token="a"), redis_lock(client, prefix, token="b")

    assert first.acquire() is True
    assert second.acquire() is False

    assert client.get(f"{prefix}:leader") == "a"
    assert 29_000 < client.pttl(f"{prefix}:leader") <= 30_000


def test_the_holder_renews_and_takes_again_its_own_lock(client, prefix):
    holder = redis_lock(client, prefix, token="a")
    holder.acquire()
    client.pexpire(f"{prefix}:leader", 2_000)  # 28 s went by

    assert holder.renew() is True
    assert 29_000 < client.pttl(f"{prefix}:leader") <= 30_000
    client.pexpire(f"{prefix}:leader", 2_000)
    assert holder.acquire() is True  # already its own: renewed, not refused
    assert 29_000 < client.pttl(f"{prefix}:leader") <= 30_000


def test_a_stale_holder_can_neither_renew_nor_release_nor_record(client, prefix):
    stale, current = redis_lock(client, prefix, token="a"), redis_lock(client, prefix, token="b")
    stale.acquire()
    client.delete(f"{prefix}:leader")  # its TTL ran out while it was frozen
    assert current.acquire() is True
    client.pexpire(f"{prefix}:leader", 10_000)

    assert stale.renew() is False
    stale.release()
    assert stale.record_runs({"admission-cycle": 100.0}) is False

    assert client.get(f"{prefix}:leader") == "b"
    assert 9_000 < client.pttl(f"{prefix}:leader") <= 10_000  # not prolonged by the stale one
    assert current.last_runs() == {}


def test_the_holder_records_last_runs_that_any_beat_reads(client, prefix):
    holder, other = redis_lock(client, prefix, token="a"), redis_lock(client, prefix, token="b")
    holder.acquire()

    assert holder.record_runs({"admission-cycle": 1765065600.25, "daily-usage": 1765065000.0})
    assert holder.record_runs({"admission-cycle": 1765065601.5})

    assert other.last_runs() == {"admission-cycle": 1765065601.5, "daily-usage": 1765065000.0}


def test_the_redis_lock_expires_after_its_ttl(client, prefix):
    killed, standby = redis_lock(client, prefix, ttl_s=0.3), redis_lock(client, prefix)
    killed.acquire()
    assert standby.acquire() is False

    wait_for(lambda: client.get(f"{prefix}:leader") is None, timeout=3, what="the TTL")

    assert standby.acquire() is True


def test_release_frees_the_lock_for_the_next_beat(client, prefix):
    first, second = redis_lock(client, prefix, token="a"), redis_lock(client, prefix, token="b")
    first.acquire()

    first.release()

    assert client.get(f"{prefix}:leader") is None
    assert second.acquire() is True


def test_an_unreachable_redis_leads_nowhere():
    lock = beat_lock(f"redis://127.0.0.1:{free_port()}/0", key_prefix="gantry:beat", ttl_s=30)

    assert lock.acquire() is False
    assert lock.renew() is False
    lock.release()
    assert lock.record_runs({"admission-cycle": 100.0}) is False
    with pytest.raises(LockUnreachable, match="ConnectionError"):
        lock.last_runs()


def test_the_logs_name_where_the_lock_is_without_the_password():
    assert lock_where("redis://:s3cret@redis.internal:6380/2") == "redis redis.internal:6380/2"
    assert lock_where("rediss://user:s3cret@redis.internal") == "rediss redis.internal:6379/0"
    assert lock_where("file:///var/lib/gantry/beat") == "file /var/lib/gantry/beat"
    with pytest.raises(ValueError, match="redis://, rediss:// or file://, not 'postgres'"):
        beat_lock("postgres://db/gantry", key_prefix="gantry:beat", ttl_s=30)


# --- a file (the embedded default) ----------------------------------------------------------


def test_one_beat_at_a_time_takes_the_file_lock(tmp_path):
    first, second = FileBeatLock(tmp_path / "beat"), FileBeatLock(tmp_path / "beat")

    assert first.acquire() is True
    assert second.acquire() is False
    assert first.renew() is True
    assert second.renew() is False

    first.release()
    assert second.acquire() is True


def test_a_killed_holders_file_lock_is_free_at_once(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from portal.beat_lock import FileBeatLock;"
         f"assert FileBeatLock(Path({str(tmp_path)!r})).acquire(); print('held', flush=True);"
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        standby = FileBeatLock(tmp_path)
        assert standby.acquire() is False

        holder.kill()
        holder.wait()

        assert standby.acquire() is True
    finally:
        holder.kill()
        holder.wait()


def test_a_removed_lock_file_is_a_lost_lock(tmp_path):
    holder = FileBeatLock(tmp_path)
    holder.acquire()

    (tmp_path / "leader.lock").unlink()

    assert holder.renew() is False
    assert holder.record_runs({"admission-cycle": 100.0}) is False
    assert FileBeatLock(tmp_path).acquire() is True


def test_the_file_holder_records_last_runs_and_others_cannot(tmp_path):
    holder, other = FileBeatLock(tmp_path), FileBeatLock(tmp_path)
    holder.acquire()

    assert holder.record_runs({"admission-cycle": 1765065600.25, "daily-usage": 1765065000.0})
    assert holder.record_runs({"admission-cycle": 1765065601.5})
    assert other.record_runs({"daily-usage": 1.0}) is False

    assert other.last_runs() == {"admission-cycle": 1765065601.5, "daily-usage": 1765065000.0}
    (tmp_path / "last-run.json").write_text("{half")
    assert other.last_runs() == {}


# --- leadership over time ---------------------------------------------------------------------


def test_a_leader_renews_every_third_of_the_ttl(client, prefix):
    leadership = Leadership(redis_lock(client, prefix), ttl_s=30, poll_s=5)
    assert leadership.check(100.0) == "acquired"
    assert leadership.seconds_to_next_check(100.0) == 10.0
    client.pexpire(f"{prefix}:leader", 25_000)

    assert leadership.check(109.9) is None
    assert client.pttl(f"{prefix}:leader") <= 25_000  # not renewed yet
    assert leadership.check(110.0) is None
    assert client.pttl(f"{prefix}:leader") > 29_000  # renewed
    assert leadership.leading is True
    assert leadership.seconds_to_next_check(110.0) == 10.0


def test_a_standby_tries_every_poll_and_leads_once_the_lock_is_free(client, prefix):
    leader = Leadership(redis_lock(client, prefix), ttl_s=30, poll_s=5)
    standby = Leadership(redis_lock(client, prefix), ttl_s=30, poll_s=5)
    leader.check(100.0)

    assert standby.check(100.0) is None
    assert standby.leading is False
    assert standby.seconds_to_next_check(100.0) == 5.0
    client.delete(f"{prefix}:leader")  # the leader was killed and its TTL ran out
    assert standby.check(104.9) is None  # not asked before its poll
    assert standby.leading is False

    assert standby.check(105.0) == "acquired"
    assert standby.leading is True


def test_a_leader_frozen_past_its_ttl_learns_it_lost_before_sending(client, prefix):
    frozen = Leadership(redis_lock(client, prefix), ttl_s=30, poll_s=5)
    frozen.check(100.0)
    client.delete(f"{prefix}:leader")
    Leadership(redis_lock(client, prefix), ttl_s=30, poll_s=5).check(131.0)

    assert frozen.check(160.0) == "lost"
    assert frozen.leading is False
    assert frozen.seconds_to_next_check(160.0) == 5.0
    assert frozen.check(165.0) is None  # the other one still holds it
