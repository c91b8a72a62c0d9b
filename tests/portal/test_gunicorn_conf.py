"""gunicorn's settings (portal/gunicorn_conf.py): sync workers sized for the machine, threads
on request, each number settable, nonsense refused at start."""

import importlib

import pytest

from portal import gunicorn_conf


def loaded(monkeypatch, **env: str):
    for name in ("GANTRY_WEB_WORKERS", "GANTRY_WEB_THREADS", "GANTRY_WEB_BIND"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return importlib.reload(gunicorn_conf)


def test_defaults_are_one_sync_worker_per_core_plus_one(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    conf = loaded(monkeypatch)
    assert (conf.worker_class, conf.workers, conf.threads) == ("sync", 3, 1)
    assert conf.bind == "127.0.0.1:8000"  # loopback unless told otherwise
    assert conf.timeout == 60


def test_every_number_can_be_set_and_empty_means_the_default(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    conf = loaded(monkeypatch, GANTRY_WEB_WORKERS="5", GANTRY_WEB_THREADS="", GANTRY_WEB_BIND="")
    assert (conf.worker_class, conf.workers, conf.threads) == ("sync", 5, 1)
    assert conf.bind == "127.0.0.1:8000"
    conf = loaded(monkeypatch, GANTRY_WEB_THREADS="4")
    assert (conf.worker_class, conf.workers, conf.threads) == ("gthread", 9, 4)


@pytest.mark.parametrize("value", ["0", "-2"])
def test_fewer_than_one_worker_is_refused(monkeypatch, value):
    with pytest.raises(ValueError, match=f"GANTRY_WEB_WORKERS must be at least 1, not '{value}'"):
        loaded(monkeypatch, GANTRY_WEB_WORKERS=value)


def teardown_module():
    importlib.reload(gunicorn_conf)
