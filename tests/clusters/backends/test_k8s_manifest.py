"""Kubernetes manifests: every shape against the official schemas (kubernetes-validate,
offline), golden files, field-by-field expectations, and hostile input.

Regenerate the golden files after a reviewed change with
``GANTRY_UPDATE_GOLDEN=1 pytest tests/clusters/backends/test_k8s_manifest.py``.
"""

import json
import os
import re
from dataclasses import replace

import jsonschema
import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from clusters.backends.base import JobSpec, PermanentBackendError
from clusters.backends.k8s_manifest import (
    MAX_OBJECT_NAME,
    label_value,
    namespace_for,
    object_name,
    render,
    stored_as_yaml,
    to_json,
    to_yaml,
)
from clusters.backends.k8s_settings import parse_settings
from core.schema import SchemaError
from tests import TESTS
from tests.clusters.backends.kubernetes_expansion import pod_process
from tests.k8s_schemas import validate

GOLDEN = TESTS / "golden" / "k8s"
# The newest Kubernetes whose schemas kubernetes-validate bundles, and the oldest Gantry
# supports (podFailurePolicy with onPodConditions is GA from 1.31).
K8S_VERSIONS = ("1.31", kubernetes_validate.utils.latest_version())
DIGEST = "sha256:" + "a" * 64
TOKEN = "gat_41.s3cr3t-t0ken-value"
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

BASE_SETTINGS = {
    "url": "https://k8s.example.org:6443",
    "token_env": "GANTRY_K8S_TOKEN",
    "ca_file": "/etc/gantry/k8s-ca.crt",
    "flavors": {
        "a100-80gb": {"product": "NVIDIA-A100-SXM4-80GB"},
        "h100-80gb": {
            "product": "NVIDIA-H100-80GB-HBM3",
            "tolerations": [
                {"key": "gpu-class", "operator": "Equal", "value": "h100", "effect": "NoSchedule"}
            ],
        },
        "a100-1g.10gb": {"product": "NVIDIA-A100-SXM4-80GB", "resource": "nvidia.com/mig-1g.10gb"},
    },
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
}


def spec_for(**overrides) -> JobSpec:
    values = {
        "name": "gantry-a41",
        "attempt_id": 41,
        "run_id": 17,
        "tenant": "vision",
        "project": "detection",
        "image": f"registry.example.org/ml/pytorch@{DIGEST}",
        "command": "python train.py --epochs 3",
        "env": {"LR": "0.1"},
        "api_url": "https://gantry.example.org/api/v1",
        "flavor": "a100-80gb",
        "nodes": 1,
        "gpus_per_node": 1,
        "max_runtime_s": 7200,
        "attempt_token": TOKEN,
    }
    values.update(overrides)
    return JobSpec(**values)


SHAPES = {
    "single-gpu": ({}, {}),
    "multi-gpu": (
        {"shm_size": "64Gi", "ttl_seconds_after_finished": 600, "retriable_exit_codes": [75]},
        {
            "gpus_per_node": 8,
            "flavor": "h100-80gb",
            "resume_step": 1200,
            "resume_uri": "s3://ckpt/run-17/step-1200",
        },
    ),
    "multi-node": (
        {},
        {
            "nodes": 4,
            "gpus_per_node": 8,
            # Written with every "$" doubled: Kubernetes reads "$$" back as "$".
            "command": "torchrun --nnodes=$WORLD_SIZE --node_rank=$RANK train.py --tag '$(HOME)'",
        },
    ),
    "mig": ({}, {"flavor": "a100-1g.10gb", "gpus_per_node": 1}),
    "kueue": (
        {
            "queueing": "kueue",
            "kueue_queue": "gpu-queue",
            "kueue_topology_level": "cloud.provider.com/topology-block",
        },
        {"nodes": 2, "gpus_per_node": 8},
    ),
    "volcano": (
        {"queueing": "volcano", "volcano_queue": "research"},
        {"nodes": 2, "gpus_per_node": 8},
    ),
}


def shape(name: str, *, token: str = "") -> list[dict]:
    extra_settings, spec_overrides = SHAPES[name]
    settings_ = parse_settings({**BASE_SETTINGS, **extra_settings})
    return render(spec_for(**spec_overrides), settings_, token=token)


def by_kind(objects: list[dict]) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in objects}


def container_of(objects: list[dict]) -> dict:
    return by_kind(objects)["Job"]["spec"]["template"]["spec"]["containers"][0]


def env_of(objects: list[dict]) -> dict[str, dict]:
    return {item["name"]: item for item in container_of(objects)["env"]}


# --- schemas and golden files --------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shape_passes_the_official_schemas(name, version):
    for obj in shape(name):
        validate(obj, version)


def test_the_validator_does_reject_a_wrong_manifest():
    job = by_kind(shape("single-gpu"))["Job"]
    job["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # typo of resources
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(job, K8S_VERSIONS[-1])
    deadline = by_kind(shape("single-gpu"))["Job"]
    deadline["spec"]["activeDeadlineSeconds"] = "7200"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deadline, K8S_VERSIONS[-1])
    group = by_kind(shape("volcano"))["PodGroup"]
    group["spec"]["minMembers"] = 2
    with pytest.raises(jsonschema.ValidationError):
        validate(group, K8S_VERSIONS[-1])


def wrong_manifests() -> list[tuple[str, dict]]:
    """Objects kubernetes-validate refuses, each for another reason."""
    typo = by_kind(shape("single-gpu"))["Job"]
    typo["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    deadline = by_kind(shape("single-gpu"))["Job"]
    deadline["spec"]["activeDeadlineSeconds"] = "7200"
    no_image_name = by_kind(shape("multi-node"))["Job"]
    del no_image_name["spec"]["template"]["spec"]["containers"][0]["name"]
    bad_port = by_kind(shape("multi-node"))["Service"]
    bad_port["spec"]["ports"][0]["port"] = "rendezvous"
    bad_policy = by_kind(shape("multi-gpu"))["Job"]
    bad_policy["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["kind"] = "x"
    secret_list = by_kind(shape("single-gpu"))["Secret"]
    secret_list["stringData"] = ["GANTRY_ATTEMPT_TOKEN"]
    return [
        ("unknown field", typo),
        ("wrong type", deadline),
        ("required field missing", no_image_name),
        ("int-or-string given a name", bad_port),
        ("unknown field in a nested list", bad_policy),
        ("list for a map", secret_list),
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_cached_validator_refuses_what_kubernetes_validate_refuses(version):
    for why, obj in wrong_manifests():
        with pytest.raises(kubernetes_validate.ValidationError) as theirs:
            kubernetes_validate.validate(obj, version, strict=True)
        with pytest.raises(kubernetes_validate.ValidationError) as ours:
            validate(obj, version)
        assert (list(ours.value.path), ours.value.message, ours.value.version) == (
            list(theirs.value.path),
            theirs.value.message,
            theirs.value.version,
        ), why
    for name in SHAPES:
        for obj in shape(name):
            if obj["kind"] != "PodGroup":
                assert kubernetes_validate.validate(obj, version, strict=True)
                validate(obj, version)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shape_matches_its_golden_file(name):
    text = to_yaml(shape(name))
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("GANTRY_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()
    assert list(yaml.safe_load_all(text)) == shape(name)


# --- field by field ------------------------------------------------------------------------


def test_single_gpu_job_fields():
    objects = shape("single-gpu")
    assert [o["kind"] for o in objects] == ["Secret", "Job"]
    job = objects[-1]
    assert job["metadata"]["name"] == "gantry-a41"
    assert job["metadata"]["namespace"] == "gantry-vision"
    assert job["metadata"]["labels"] == {
        "gantry.io/tenant": "vision",
        "gantry.io/project": "detection",
        "gantry.io/run": "17",
        "gantry.io/attempt": "41",
        "app.kubernetes.io/managed-by": "gantry",
    }
    assert job["metadata"]["annotations"] == {
        "gantry.io/tenant": "vision",
        "gantry.io/project": "detection",
    }
    spec = job["spec"]
    assert (spec["completions"], spec["parallelism"], spec["completionMode"]) == (1, 1, "Indexed")
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (0, 7200)
    assert spec["ttlSecondsAfterFinished"] == 3600
    assert spec["podReplacementPolicy"] == "Failed"
    assert "suspend" not in spec
    assert spec["podFailurePolicy"]["rules"] == [
        {
            "action": "FailJob",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        },
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": "trainer",
                "operator": "In",
                "values": list(range(1, 128)),
            },
        },
    ]
    pod = spec["template"]["spec"]
    assert spec["template"]["metadata"]["labels"] == job["metadata"]["labels"]
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert "subdomain" not in pod and "schedulerName" not in pod
    container = pod["containers"][0]
    assert container["image"] == f"registry.example.org/ml/pytorch@{DIGEST}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["command"] == ["/bin/bash", "-c", "python train.py --epochs 3"]
    assert "args" not in container
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert [e["name"] for e in container["env"]] == [
        "GANTRY_API_URL",
        "GANTRY_IMAGE",
        "LR",
        "GANTRY_ATTEMPT_TOKEN",
    ]
    assert env_of(objects)["GANTRY_ATTEMPT_TOKEN"] == {
        "name": "GANTRY_ATTEMPT_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "gantry-a41-token", "key": "GANTRY_ATTEMPT_TOKEN"}},
    }


def test_multi_gpu_flavor_tolerations_resume_and_retriable_codes():
    objects = shape("multi-gpu")
    job = by_kind(objects)["Job"]
    pod = job["spec"]["template"]["spec"]
    assert container_of(objects)["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "gpu-class", "operator": "Equal", "value": "h100", "effect": "NoSchedule"},
    ]
    assert pod["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}
    ]
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[1] == {
        "action": "Ignore",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [75]},
    }
    assert rules[2]["action"] == "FailJob"
    assert rules[2]["onExitCodes"]["values"] == [c for c in range(1, 128) if c != 75]
    env = env_of(objects)
    assert env["GANTRY_RESUME_FROM"] == {
        "name": "GANTRY_RESUME_FROM",
        "value": "s3://ckpt/run-17/step-1200",
    }
    assert env["GANTRY_RESUME_STEP"] == {"name": "GANTRY_RESUME_STEP", "value": "1200"}


def test_multi_node_has_a_headless_service_and_rank_wiring():
    objects = shape("multi-node")
    assert [o["kind"] for o in objects] == ["Secret", "Service", "Job"]
    service, job = objects[1], objects[2]
    assert service["metadata"]["name"] == "gantry-a41"
    assert service["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {"gantry.io/attempt": "41"},
        "ports": [{"name": "rendezvous", "port": 29500, "targetPort": 29500, "protocol": "TCP"}],
    }
    assert (job["spec"]["completions"], job["spec"]["parallelism"]) == (4, 4)
    assert job["spec"]["template"]["spec"]["subdomain"] == "gantry-a41"
    env = env_of(objects)
    assert env["MASTER_ADDR"]["value"] == "gantry-a41-0.gantry-a41"
    assert env["MASTER_PORT"]["value"] == "29500"
    assert env["WORLD_SIZE"]["value"] == "4"
    assert env["RANK"] == {
        "name": "RANK",
        "valueFrom": {
            "fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
            }
        },
    }
    assert container_of(objects)["ports"] == [
        {"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"}
    ]


def test_mig_flavor_asks_for_its_mig_resource():
    objects = shape("mig")
    assert container_of(objects)["resources"] == {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    pod = by_kind(objects)["Job"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


def test_kueue_job_is_suspended_with_queue_label_and_topology_annotation():
    job = by_kind(shape("kueue"))["Job"]
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]
    assert job["spec"]["template"]["metadata"]["annotations"] == {
        "gantry.io/tenant": "vision",
        "gantry.io/project": "detection",
        "kueue.x-k8s.io/podset-required-topology": "cloud.provider.com/topology-block",
    }
    preferred = parse_settings(
        {**BASE_SETTINGS, **SHAPES["kueue"][0], "kueue_topology_mode": "preferred"}
    )
    job = render(spec_for(nodes=2), preferred)[-1]
    assert (
        job["spec"]["template"]["metadata"]["annotations"][
            "kueue.x-k8s.io/podset-preferred-topology"
        ]
        == "cloud.provider.com/topology-block"
    )


# --- placement: pinned without Kueue, a topology ask with it ------------------------------

TOPOLOGY = {
    "topology_labels": [
        {"name": "block", "label": "cloud.provider.com/topology-block"},
        "cloud.provider.com/topology-rack",
    ]
}
KUEUE = {**SHAPES["kueue"][0], **TOPOLOGY}
GANG = ("gpu-b1-r2-07", "gpu-b1-r2-11", "gpu-b1-r3-02", "gpu-b1-r3-05")
# Shapes of placed attempts. They are not golden files: their fields are checked one by
# one below, and every object against the official schemas here.
PLACED = {
    "placed-gang": ({}, {"nodes": 4, "gpus_per_node": 8, "placement": GANG}),
    "placed-single": ({}, {"placement": ("gpu-b1-r2-07",)}),
    "placed-volcano": (SHAPES["volcano"][0], {"nodes": 2, "placement": GANG[:2]}),
    "kueue-required-level": (
        KUEUE,
        {"nodes": 4, "placement": GANG, "topology_level": "rack", "topology_required": True},
    ),
    "kueue-preferred-level": (
        KUEUE,
        {"nodes": 4, "placement": GANG, "topology_level": "block"},
    ),
}


def placed(name: str) -> list[dict]:
    extra_settings, spec_overrides = PLACED[name]
    return render(spec_for(**spec_overrides), parse_settings({**BASE_SETTINGS, **extra_settings}))


def pod_spec_of(objects: list[dict]) -> dict:
    return by_kind(objects)["Job"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(PLACED))
def test_every_placed_shape_passes_the_official_schemas(name, version):
    for obj in placed(name):
        validate(obj, version)


def test_a_placed_gang_is_pinned_to_its_nodes_one_rank_on_each():
    assert pod_spec_of(placed("placed-gang"))["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                # One term per node, ORed: a node field selector takes one value.
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}
                    for n in GANG
                ]
            }
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"gantry.io/attempt": "41"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        },
    }


def test_a_placed_single_node_job_is_pinned_without_anti_affinity():
    assert pod_spec_of(placed("placed-single"))["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["gpu-b1-r2-07"]}
                        ]
                    }
                ]
            }
        }
    }


def test_volcano_pods_are_pinned_too():
    pod = pod_spec_of(placed("placed-volcano"))
    assert pod["schedulerName"] == "volcano"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["matchFields"][0]["values"] for t in terms["nodeSelectorTerms"]] == [
        [GANG[0]],
        [GANG[1]],
    ]
    assert "podAntiAffinity" in pod["affinity"]


def test_without_a_placement_the_scheduler_places_the_pods():
    for name in SHAPES:
        assert "affinity" not in pod_spec_of(shape(name))


def test_with_kueue_the_level_asked_for_is_annotated_and_no_node_is_pinned():
    required = by_kind(placed("kueue-required-level"))["Job"]["spec"]["template"]
    assert "affinity" not in required["spec"]
    assert required["metadata"]["annotations"] == {
        "gantry.io/tenant": "vision",
        "gantry.io/project": "detection",
        "kueue.x-k8s.io/podset-required-topology": "cloud.provider.com/topology-rack",
    }
    preferred = by_kind(placed("kueue-preferred-level"))["Job"]["spec"]["template"]
    assert "affinity" not in preferred["spec"]
    assert preferred["metadata"]["annotations"] == {
        "gantry.io/tenant": "vision",
        "gantry.io/project": "detection",
        "kueue.x-k8s.io/podset-preferred-topology": "cloud.provider.com/topology-block",
    }


def test_with_kueue_and_no_level_asked_for_the_clusters_default_applies():
    settings_ = parse_settings({**BASE_SETTINGS, **KUEUE})
    annotations = render(spec_for(nodes=2, placement=GANG[:2]), settings_)[-1]["spec"]["template"][
        "metadata"
    ]["annotations"]
    assert annotations["kueue.x-k8s.io/podset-required-topology"] == (
        "cloud.provider.com/topology-block"
    )
    unknown = spec_for(nodes=2, topology_level="superpod")  # preferred: the default holds
    annotations = render(unknown, settings_)[-1]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["kueue.x-k8s.io/podset-required-topology"] == (
        "cloud.provider.com/topology-block"
    )
    no_default = parse_settings({**BASE_SETTINGS, **KUEUE, "kueue_topology_level": ""})
    annotations = render(spec_for(nodes=2), no_default)[-1]["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert annotations == {"gantry.io/tenant": "vision", "gantry.io/project": "detection"}


def test_with_kueue_a_required_level_the_cluster_lacks_is_refused():
    settings_ = parse_settings({**BASE_SETTINGS, **KUEUE})
    with pytest.raises(
        PermanentBackendError,
        match=r"needs its nodes in one superpod, a topology level this cluster does not have "
        r"\(its levels: block, rack\)",
    ):
        render(spec_for(nodes=2, topology_level="superpod", topology_required=True), settings_)


@pytest.mark.parametrize("placement", [("gpu-1",), ("gpu-1", "gpu-1"), ("gpu-1", "gpu-2", "gpu-3")])
def test_a_placement_that_is_not_one_node_per_rank_is_refused(placement):
    with pytest.raises(
        PermanentBackendError, match=r"must name 2 distinct nodes, one per rank; it names gpu-1"
    ):
        render(spec_for(nodes=2, placement=placement), parse_settings(BASE_SETTINGS))


def test_topology_levels_are_named_by_the_settings_or_by_their_label():
    settings_ = parse_settings({**BASE_SETTINGS, **TOPOLOGY})
    assert settings_.levels == ("block", "rack")
    assert settings_.level_label("rack") == "cloud.provider.com/topology-rack"
    assert settings_.level_label("zone") == ""
    default = parse_settings(BASE_SETTINGS)
    assert default.levels == ()
    zone = parse_settings({**BASE_SETTINGS, "topology_labels": ["topology.kubernetes.io/zone"]})
    assert zone.levels == ("zone",)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("topology.kubernetes.io/zone", "must be a list"),
        ([{"label": "example.org/rack"}], "neither a node label key nor"),
        ([{"name": "rack", "label": "not a label"}], "'not a label' is not a node label key"),
        ([{"name": "", "label": "example.org/rack"}], "level name '' must be"),
        (["a.example.org/rack", "b.example.org/rack"], "level name rack given twice"),
        (
            ["example.org/rack", {"name": "switch", "label": "example.org/rack"}],
            "level label example.org/rack given twice",
        ),
        ([42], "neither a node label key nor"),
    ],
)
def test_bad_topology_labels_say_what_is_wrong(labels, message):
    with pytest.raises(SchemaError, match=message):
        parse_settings({**BASE_SETTINGS, "topology_labels": labels})


def test_volcano_gang_has_a_pod_group_and_the_volcano_scheduler():
    objects = shape("volcano")
    assert [o["kind"] for o in objects] == ["Secret", "Service", "PodGroup", "Job"]
    group = by_kind(objects)["PodGroup"]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["metadata"]["name"] == "gantry-a41"
    assert group["spec"] == {
        "minMember": 2,
        "queue": "research",
        "minResources": {"nvidia.com/gpu": "16"},
    }
    template = by_kind(objects)["Job"]["spec"]["template"]
    assert template["spec"]["schedulerName"] == "volcano"
    assert template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "gantry-a41"
    assert "suspend" not in by_kind(objects)["Job"]["spec"]


def test_disruption_can_be_left_to_kubernetes():
    settings_ = parse_settings({**BASE_SETTINGS, "disruption_action": "Ignore"})
    rules = render(spec_for(), settings_)[-1]["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["action"] == "Ignore"


def test_the_stored_manifest_never_holds_the_token():
    for name in SHAPES:
        stored = to_yaml(shape(name))
        assert TOKEN not in stored
        assert "GANTRY_ATTEMPT_TOKEN: <redacted>" in stored
        submitted = shape(name, token=TOKEN)
        assert by_kind(submitted)["Secret"]["stringData"] == {"GANTRY_ATTEMPT_TOKEN": TOKEN}
        assert TOKEN not in json.dumps(by_kind(submitted)["Job"])


# --- bad input -----------------------------------------------------------------------------

HOSTILE = [
    "quo\"te's",
    "naïve-ünïcødé-租户",
    "x" * 300,
    "line\nbreak\r\nand\ttab",
    "-leading-and-trailing-",
    "UPPER.case_Under",
    "",
    "--0123456789",
    "${HOME}$(rm -rf /)`id`",
    "\u202eRTL\u200bzero-width",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_label_values_are_sanitized_and_kept_in_annotations(value):
    objects = render(
        spec_for(tenant=value, project=value),
        parse_settings(BASE_SETTINGS),
    )
    for obj in objects:
        validate(obj, K8S_VERSIONS[-1])
        labels = obj["metadata"]["labels"]
        assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in labels.values())
        assert obj["metadata"]["annotations"]["gantry.io/tenant"] == value
        assert obj["metadata"]["annotations"]["gantry.io/project"] == value
        namespace = obj["metadata"]["namespace"]
        assert len(namespace) <= 63 and DNS_1035.match(namespace)
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_names_are_shortened_deterministically(value):
    name = object_name(value)
    assert len(name) <= MAX_OBJECT_NAME and DNS_1035.match(name)
    assert object_name(value) == name
    spec = spec_for(name=value, nodes=2)
    objects = render(spec, parse_settings(BASE_SETTINGS))
    for obj in objects:
        validate(obj, K8S_VERSIONS[-1])
    job = objects[-1]
    assert job["metadata"]["name"] == name
    assert job["spec"]["template"]["spec"]["subdomain"] == name
    assert len(f"{name}-99999") <= 63  # the pod hostname of the highest index fits


def test_valid_names_and_values_are_kept_as_they_are():
    assert object_name("gantry-a123") == "gantry-a123"
    assert label_value("vision") == "vision"
    assert label_value("Run_1.2-x") == "Run_1.2-x"
    assert namespace_for("vision", prefix="gantry-") == "gantry-vision"
    # A value that looks like a hashed one is hashed too, so it cannot collide with one.
    assert label_value("a--0123456789") != "a--0123456789"


text_values = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120
) | st.from_regex(r"[a-z][a-z0-9-]{0,80}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(text_values, min_size=2, max_size=8, unique=True))
def test_sanitized_values_are_valid_and_never_collide(values):
    labels = [label_value(v) for v in values]
    names = [object_name(v) for v in values]
    assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in labels)
    assert all(len(n) <= MAX_OBJECT_NAME and DNS_1035.match(n) for n in names)
    assert len(set(labels)) == len(values)
    assert len(set(names)) == len(values)
    assert [label_value(v) for v in values] == labels  # deterministic


@settings(max_examples=100, deadline=None)
@given(
    command=st.text(min_size=1, max_size=200).filter(str.strip),
    value=st.text(max_size=200),
)
def test_commands_and_env_values_pass_through_as_single_argv_elements(command, value):
    objects = render(
        spec_for(command=command, env={"USER_VALUE": value}), parse_settings(BASE_SETTINGS)
    )
    argv, env = pod_process(objects)
    # As the container gets them, after Kubernetes' own $(NAME) expansion.
    assert argv == ["/bin/bash", "-c", command]
    assert env["USER_VALUE"] == value
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects


@pytest.mark.parametrize(
    "name",
    ["1LEADING_DIGIT", "WITH-DASH", "WITH SPACE", "quo'te", "new\nline", "", "ÜMLAUT", "A=B"],
)
def test_invalid_env_names_are_refused(name):
    with pytest.raises(PermanentBackendError, match="not valid"):
        render(spec_for(env={name: "x"}), parse_settings(BASE_SETTINGS))


@pytest.mark.parametrize(
    "name",
    ["GANTRY_ATTEMPT_TOKEN", "GANTRY_IMAGE", "GANTRY_RESUME_FROM", "RANK", "MASTER_ADDR"],
)
def test_env_names_gantry_sets_itself_are_refused_where_it_sets_them(name):
    with pytest.raises(PermanentBackendError, match="set by Gantry"):
        render(spec_for(env={name: "x"}, nodes=2), parse_settings(BASE_SETTINGS))


def test_single_node_jobs_may_set_their_own_rank_variables():
    objects = render(spec_for(env={"WORLD_SIZE": "1"}), parse_settings(BASE_SETTINGS))
    assert env_of(objects)["WORLD_SIZE"] == {"name": "WORLD_SIZE", "value": "1"}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"image": "registry.example.org/ml/pytorch:latest"}, "not pinned"),
        ({"image": f"Registry.Example/ML@{DIGEST}"}, "not pinned"),
        ({"command": "   "}, "no command"),
        ({"flavor": "v100-16gb"}, "no GPU flavor 'v100-16gb'"),
        ({"max_runtime_s": 0}, "must be positive"),
    ],
)
def test_unrenderable_specs_are_permanent_errors(overrides, message):
    with pytest.raises(PermanentBackendError, match=message):
        render(spec_for(**overrides), parse_settings(BASE_SETTINGS))


@pytest.mark.parametrize(
    ("settings_", "message"),
    [
        ({"flavors": {}}, "either url or kubeconfig"),
        ({**BASE_SETTINGS, "tokn_env": "X"}, "unknown key"),
        ({**BASE_SETTINGS, "token_env": "eyJhbGciOiJSUzI1NiIs.x"}, "NAME of an environment"),
        ({**BASE_SETTINGS, "queueing": "kueue"}, "kueue_queue"),
        ({**BASE_SETTINGS, "queueing": "yunikorn"}, "none, kueue or volcano"),
        (
            {**BASE_SETTINGS, "flavors": {"a": {"product": "x", "resource": "amd.com/gpu"}}},
            "resource",
        ),
        ({**BASE_SETTINGS, "flavors": {"a": {}}}, "product"),
        ({**BASE_SETTINGS, "tolerations": [{"key": "a", "bogus": 1}]}, "not a toleration"),
        ({**BASE_SETTINGS, "master_port": 70000}, "TCP port"),
        ({**BASE_SETTINGS, "timeout_s": "10"}, "timeout_s must be float"),
        ({**BASE_SETTINGS, "namespace_prefix": "Gantry_"}, "namespace_prefix"),
        ({**BASE_SETTINGS, "disruption_action": "Count"}, "FailJob or Ignore"),
    ],
)
def test_bad_settings_say_what_is_wrong(settings_, message):
    with pytest.raises(SchemaError, match=message):
        parse_settings(settings_)


def test_rendering_is_deterministic_and_spec_order_free():
    first = to_yaml(render(spec_for(env={"B": "2", "A": "1"}), parse_settings(BASE_SETTINGS)))
    again = to_yaml(render(spec_for(env={"A": "1", "B": "2"}), parse_settings(BASE_SETTINGS)))
    assert first == again
    assert to_yaml(shape("multi-node")) == to_yaml(shape("multi-node"))
    changed = replace(spec_for(), attempt_id=42, name="gantry-a42")
    assert "gantry-a42" in to_yaml(render(changed, parse_settings(BASE_SETTINGS)))


def test_the_stored_yaml_does_not_depend_on_libyaml_being_installed():
    from clusters.backends import k8s_manifest

    class PurePython(yaml.SafeDumper):
        pass

    PurePython.yaml_representers = {
        **yaml.SafeDumper.yaml_representers,
        **k8s_manifest._Dumper.yaml_representers,
    }
    for name in SHAPES:
        objects = shape(name)
        pure = yaml.dump_all(
            objects, Dumper=PurePython, sort_keys=False, allow_unicode=True, width=100
        )
        assert to_yaml(objects) == pure
    hostile = render(
        spec_for(command="a\nb 'c' \"d\"\n", env={"V": "ü\x85\u2028x"}),
        parse_settings(BASE_SETTINGS),
    )
    assert to_yaml(hostile) == yaml.dump_all(
        hostile, Dumper=PurePython, sort_keys=False, allow_unicode=True, width=100
    )


def test_manifests_are_stored_as_json_and_read_as_the_same_yaml():
    for name in ("single-gpu", "multi-node", "volcano"):
        objects = shape(name)
        stored = to_json(objects)
        assert json.loads(stored) == objects
        assert stored_as_yaml(stored) == to_yaml(objects)
    # Non-ASCII stays readable in both (an annotation with a project name, say).
    assert to_json([{"a": "Müller"}]) == '[{"a": "Müller"}]'
    assert stored_as_yaml('[{"a": "Müller"}]') == "a: Müller\n"


def test_text_that_is_not_a_stored_manifest_list_is_shown_as_it_is():
    earlier = to_yaml(shape("single-gpu"))  # attempts stored before manifests were JSON
    assert stored_as_yaml(earlier) == earlier
    assert stored_as_yaml("") == ""
    assert stored_as_yaml('{"kind": "Job"}') == '{"kind": "Job"}'
    assert stored_as_yaml("[1, 2]") == "[1, 2]"


def test_the_yaml_of_a_stored_spec_is_kept_by_its_whole_text():
    stored_as_yaml.cache_clear()
    single, multi = to_json(shape("single-gpu")), to_json(shape("multi-node"))
    first = stored_as_yaml(single)
    assert stored_as_yaml(multi) == to_yaml(shape("multi-node"))  # another text, its own YAML
    assert stored_as_yaml(single) is first  # the same text again: not written again
    assert stored_as_yaml.cache_info().hits == 1
    changed = single.replace('"gantry-', '"other-', 1)
    assert changed != single
    assert stored_as_yaml(changed) == to_yaml(json.loads(changed))
