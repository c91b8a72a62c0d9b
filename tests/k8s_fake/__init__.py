"""A Kubernetes API server good enough for the official client, and a tiny controller.

It lives in the tests: nothing in ``jobs/`` knows about it. ``FakeKubernetes`` bundles the
store, the HTTP server (127.0.0.1, a free port unless given) and the controller::

    with FakeKubernetes() as fake:
        fake.controller.add_node("gpu-1", product="NVIDIA-A100-SXM4-80GB", gpus=8)
        fake.controller.add_pod("etl-1", namespace="data-eng", node="gpu-1", gpus=4)
        fake.controller.cordon("gpu-1")
        ...  # point a client at fake.url
        fake.controller.advance(30)
"""

import ssl

from tests.k8s_fake.controller import Controller
from tests.k8s_fake.server import FakeApiServer
from tests.k8s_fake.store import ApiError, Clock, Store


class FakeKubernetes:
    def __init__(
        self,
        *,
        port: int = 0,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        runtime_s: float = 60.0,
    ):
        self.store = Store(Clock())
        self.controller = Controller(self.store, runtime_s=runtime_s)
        self.server = FakeApiServer(
            self.store,
            port=port,
            token=token,
            ssl_context=ssl_context,
            logs=self.controller.pod_logs,
        )

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> "FakeKubernetes":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> "FakeKubernetes":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = ["ApiError", "Clock", "Controller", "FakeApiServer", "FakeKubernetes", "Store"]
