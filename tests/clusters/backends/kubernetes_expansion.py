"""What a container gets from a pod spec: Kubernetes' own ``$(NAME)`` expansion, for tests.

``expand`` follows Kubernetes' ``third_party/forked/golang/expansion/expand.go`` (``Expand``
with ``MappingFuncFor``): ``$$`` is one ``$``; ``$(NAME)`` is NAME's value when NAME is
defined and stays as written when not (``$()`` too); ``$(`` without a ``)`` stays; a ``$``
before any other character, or at the end, stays. ``container_process`` applies it the way
the kubelet does (``pkg/kubelet/kubelet_pods.go``, ``makeEnvironmentVariables``, and
``ExpandContainerCommandAndArgs``): each env value is expanded against the variables declared
before it and the service variables, an empty value is not expanded, ``valueFrom`` values are
resolved and not expanded; then ``command`` and ``args`` against all of the container's
variables. Strings are Python text: ``$``, ``(`` and ``)`` are ASCII, and UTF-8 never uses
their bytes inside another character, so text and bytes expand alike.
"""

import base64
from collections.abc import Mapping
from typing import Any

# What a pod's containers get from the cluster's "kubernetes" Service even with
# enableServiceLinks: false (the values are this test cluster's).
SERVICE_ENV = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
}


def expand(text: str, variables: Mapping[str, str]) -> str:
    out: list[str] = []
    i, end = 0, len(text)
    while i < end:
        if text[i] != "$" or i + 1 == end:
            out.append(text[i])
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            close = text.find(")", i + 2)
            if close == -1:
                out.append("$(")
                i += 2
            else:
                name = text[i + 2 : close]
                out.append(variables.get(name, f"$({name})"))
                i = close + 1
        else:
            out.append("$" + following)
            i += 2
    return "".join(out)


def container_process(
    container: Mapping[str, Any],
    *,
    secrets: Mapping[str, Mapping[str, str]],
    annotations: Mapping[str, str] = {},
    service_env: Mapping[str, str] = SERVICE_ENV,
) -> tuple[list[str], dict[str, str]]:
    """The argv and the environment (its declared variables and the service variables) the
    kubelet starts ``container`` with. ``secrets`` maps a Secret's name to its data, for
    ``secretKeyRef``; ``annotations`` are the pod's, for ``fieldRef``."""
    declared: dict[str, str] = {}
    for item in container.get("env", []):
        if item.get("value"):
            value = expand(item["value"], {**service_env, **declared})
        elif "valueFrom" in item:
            source = item["valueFrom"]
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = secrets[ref["name"]][ref["key"]]
            else:
                path = source["fieldRef"]["fieldPath"]
                key = path.removeprefix("metadata.annotations['").removesuffix("']")
                value = annotations[key]
        else:
            value = ""
        declared[item["name"]] = value
    environment = {**service_env, **declared}
    argv = [
        expand(part, environment) for part in [*container["command"], *container.get("args", [])]
    ]
    return argv, environment


def pod_process(
    objects: list[Mapping[str, Any]], *, index: int = 0
) -> tuple[list[str], dict[str, str]]:
    """``container_process`` for the container of pod ``index`` of the Job among an
    attempt's objects (as rendered, or as an API server keeps them), with the Secrets among
    them."""
    secrets = {
        o["metadata"]["name"]: o.get("stringData")
        or {key: base64.b64decode(value).decode() for key, value in o["data"].items()}
        for o in objects
        if o["kind"] == "Secret"
    }
    job = next(o for o in objects if o["kind"] == "Job")
    template = job["spec"]["template"]
    annotations = {
        **template["metadata"].get("annotations", {}),
        "batch.kubernetes.io/job-completion-index": str(index),
    }
    container = template["spec"]["containers"][0]
    return container_process(container, secrets=secrets, annotations=annotations)
