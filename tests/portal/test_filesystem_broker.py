"""The embedded default's broker (portal/filesystem_broker.py): a reader sees a message or
an exchange table whole or not at all, whatever other processes write at the same time."""

import multiprocessing
import os
from pathlib import Path

import pytest
from kombu import Connection
from kombu.transport import filesystem

from portal import filesystem_broker
from portal.celery import app

QUEUE = "celery"


def connection(folder: Path) -> Connection:
    return Connection(
        "filesystem://",
        transport_options={
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
        },
    )


@pytest.fixture
def folder(tmp_path):
    for name in ("queue", "control"):
        (tmp_path / name).mkdir()
    return tmp_path


def test_filesystem_urls_get_the_atomic_transport_in_every_process_that_loads_the_app():
    with Connection("filesystem://") as conn:
        assert type(conn.transport) is filesystem_broker.Transport
    assert app.conf.broker_url.startswith("redis://")  # the suite's broker is Redis


def test_a_message_is_invisible_to_readers_until_it_is_whole(folder, monkeypatch):
    channel = connection(folder).channel()
    seen_while_writing = []
    replace = os.replace

    def replace_checking(source, target):
        # Written, not yet renamed: no reader may take it, nor count it.
        seen_while_writing.append((Path(source).read_bytes() != b"", channel._size(QUEUE)))
        with pytest.raises(filesystem.Empty):
            channel._get(QUEUE)
        replace(source, target)

    monkeypatch.setattr(filesystem_broker.os, "replace", replace_checking)
    channel._put(QUEUE, {"body": "x" * 10_000})
    assert seen_while_writing == [(True, 0)]
    assert channel._size(QUEUE) == 1
    assert channel._get(QUEUE) == {"body": "x" * 10_000}
    assert sorted(os.listdir(folder / "queue")) == []


def _put_many(folder: Path, writer: int, count: int) -> None:
    channel = connection(folder).channel()
    for number in range(count):
        channel._put(QUEUE, {"writer": writer, "number": number, "pad": "y" * 4096})


def test_messages_written_by_other_processes_are_read_whole_and_all(folder):
    writers = [
        multiprocessing.get_context("fork").Process(target=_put_many, args=(folder, w, 150))
        for w in range(2)
    ]
    for writer in writers:
        writer.start()
    channel = connection(folder).channel()
    got = []
    while len(got) < 300:
        try:
            message = channel._get(QUEUE)
        except filesystem.Empty:
            assert any(w.is_alive() for w in writers) or channel._size(QUEUE) > 0
            continue
        got.append((message["writer"], message["number"]))
    for writer in writers:
        writer.join(timeout=30)
        assert writer.exitcode == 0
    assert sorted(got) == [(w, n) for w in range(2) for n in range(150)]
    assert os.listdir(folder / "queue") == []


def _bind_many(folder: Path, writer: int, count: int) -> None:
    channel = connection(folder).channel()
    for number in range(count):
        channel._queue_bind("celery.pidbox", "", "", f"q{writer}-{number}")
        assert channel.get_table("celery.pidbox")  # never read half-written


def test_exchange_tables_keep_every_binding_of_concurrent_processes(folder):
    binders = [
        multiprocessing.get_context("fork").Process(target=_bind_many, args=(folder, w, 60))
        for w in range(3)
    ]
    for binder in binders:
        binder.start()
    for binder in binders:
        binder.join(timeout=60)
        assert binder.exitcode == 0
    channel = connection(folder).channel()
    queues = sorted(binding.queue for binding in channel.get_table("celery.pidbox"))
    assert queues == sorted(f"q{w}-{n}" for w in range(3) for n in range(60))

    channel._queue_bind("celery.pidbox", "", "", "q0-0")  # bound twice: listed once
    assert len(channel.get_table("celery.pidbox")) == 180
    channel._delete("q1-7", "celery.pidbox", "", "")
    remaining = [binding.queue for binding in channel.get_table("celery.pidbox")]
    assert (len(remaining), "q1-7" in remaining, "q1-8" in remaining) == (179, False, True)
    assert channel.get_table("no-such-exchange") == []
    assert sorted(p.name for p in (folder / "control").iterdir()) == [
        "celery.pidbox.exchange",
        "celery.pidbox.exchange.lock",
    ]
