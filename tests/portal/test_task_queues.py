"""Every Celery task goes to the queue of its kind (portal/task_queues.py), and a worker
started without -Q (docker-compose.yml, make run) consumes every queue."""

import redis
from django.conf import settings

from portal import task_queues
from portal.celery import app as celery_app


def gantry_tasks() -> set[str]:
    celery_app.loader.import_default_modules()  # autodiscovery, as a worker does at start
    return {name for name in celery_app.tasks if not name.startswith("celery.")}


def test_every_task_is_routed_to_a_declared_queue_by_name():
    assert gantry_tasks() == set(task_queues.QUEUE_OF_TASK)
    routed = {name: celery_app.amqp.router.route({}, name)["queue"].name for name in gantry_tasks()}
    assert routed == task_queues.QUEUE_OF_TASK
    assert set(routed.values()) == {"admission", "backend", "telemetry", "background"}


def test_a_worker_without_q_consumes_every_queue():
    assert sorted(celery_app.amqp.queues) == ["admission", "backend", "background", "telemetry"]
    assert celery_app.conf.task_default_queue == "background"


def test_a_sent_task_waits_in_its_queue_in_redis():
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(*task_queues.QUEUES)
    try:
        celery_app.send_task("jobs.tasks.admission_cycle")
        celery_app.send_task("jobs.tasks.attempt_submit", args=[1])
        celery_app.send_task("telemetry.tasks.straggler_scan")

        lengths = {queue: client.llen(queue) for queue in task_queues.QUEUES}
    finally:
        client.delete(*task_queues.QUEUES)
    assert lengths == {"admission": 1, "backend": 1, "telemetry": 1, "background": 0}
