"""Every manifest an attempt creates, for 1 and 4 nodes, CPU and GPU, each launch API, validated
against the official Kubernetes schemas (kubernetes-validate, strict), with the CRDs' embedded
Job and pod templates validated as Jobs and PodTemplates and their envelopes checked field by
field. Also: what pods compute about themselves (node, config key, rendezvous host) is consistent
with what the manifests define."""

from __future__ import annotations

import json
import math
import re

import kubernetes_validate
import pytest

from tests.conftest import ROOT
from trainflow.backends.base import AttemptPlan
from trainflow.backends.kubernetes.classify import FAILURE_RULES
from trainflow.backends.kubernetes.image import ImageRef, context_uri, kaniko_job
from trainflow.backends.kubernetes.manifests import attempt_manifests, headless_service
from trainflow.backends.kubernetes.names import LABEL_ATTEMPT, LABEL_RUN, RunNames
from trainflow.backends.kubernetes.pod import RENDEZVOUS_PORT
from trainflow.runspec import load_spec

K8S_VERSIONS = ("1.31", "1.37")  # the oldest and newest minor kubernetes-validate ships that we support
EXAMPLE = ROOT / "examples" / "specs" / "digits-kubernetes.yaml"
GPU_EXAMPLE = ROOT / "examples" / "specs" / "digits-kubernetes-gpu.yaml"
IMAGE = "registry.example.com/ml/trainflow@sha256:" + "ab" * 32
RUN_ID = "digits-k8s-20250601-100000-abc123"
APIS = ("indexed-job", "jobset", "pytorchjob")


def spec_for(nodes: int, gpu: int, api: str, *extra: str):
    overrides = [f"resources.nodes={nodes}", f"resources.gpu={gpu}", f"kubernetes.launch_api={api}", *extra]
    if gpu:
        overrides.append(f"resources.procs_per_node={gpu}")
    return load_spec(EXAMPLE, overrides)


def plan(attempt: int = 1) -> AttemptPlan:
    return AttemptPlan(attempt, "10.8.0.4:41234", "token", "abc123", None)


def validate(doc: dict) -> None:
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def as_job(template: dict, name: str) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, **template.get("metadata", {})},
        "spec": template["spec"],
    }


def as_pod_template(template: dict, name: str) -> dict:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


def pod_templates(workload: dict) -> list[dict]:
    if workload["kind"] == "Job":
        return [workload["spec"]["template"]]
    if workload["kind"] == "JobSet":
        return [workload["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]]
    return [r["template"] for r in workload["spec"]["pytorchReplicaSpecs"].values()]


def validate_workload(workload: dict) -> None:
    kind, name = workload["kind"], workload["metadata"]["name"]
    if kind == "Job":
        validate(workload)
    elif kind == "JobSet":
        assert workload["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
        spec = workload["spec"]
        assert set(spec) <= {"failurePolicy", "network", "replicatedJobs", "suspend", "successPolicy"}
        assert spec["failurePolicy"] == {"maxRestarts": 0}
        assert spec["network"]["enableDNSHostnames"] is True
        [replicated] = spec["replicatedJobs"]
        assert set(replicated) == {"name", "replicas", "template"} and replicated["replicas"] == 1
        validate(as_job(replicated["template"], f"{name}-{replicated['name']}-0"))
    else:
        assert (workload["apiVersion"], kind) == ("kubeflow.org/v1", "PyTorchJob")
        spec = workload["spec"]
        assert set(spec) == {"runPolicy", "pytorchReplicaSpecs"}
        assert spec["runPolicy"]["backoffLimit"] == 0
        assert set(spec["pytorchReplicaSpecs"]) <= {"Master", "Worker"}
        for role, replica in spec["pytorchReplicaSpecs"].items():
            assert set(replica) == {"replicas", "restartPolicy", "template"} and replica["restartPolicy"] == "Never"
            assert replica["template"]["spec"]["containers"][0]["name"] == "pytorch"
            validate(as_pod_template(replica["template"], f"{name}-{role.lower()}"))
    assert workload["metadata"]["namespace"] and re.fullmatch(r"[a-z0-9-]{1,63}", name)


CASES = [(nodes, gpu, api) for nodes in (1, 4) for gpu in (0, 2) for api in APIS]


@pytest.mark.parametrize("nodes, gpu, api", CASES, ids=[f"{n}node-{'gpu' if g else 'cpu'}-{a}" for n, g, a in CASES])
def test_every_manifest_of_an_attempt_validates(nodes, gpu, api):
    spec = spec_for(nodes, gpu, api)
    service = headless_service(spec, RUN_ID)
    config_map, workload = attempt_manifests(spec, RUN_ID, plan(), IMAGE)
    validate(service)
    validate(config_map)
    validate_workload(workload)
    replicas = {
        "Job": lambda w: w["spec"]["completions"],
        "JobSet": lambda w: w["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"],
        "PyTorchJob": lambda w: sum(r["replicas"] for r in w["spec"]["pytorchReplicaSpecs"].values()),
    }
    assert replicas[workload["kind"]](workload) == nodes
    for template in pod_templates(workload):
        container = template["spec"]["containers"][0]
        assert container["image"] == IMAGE
        limits = container["resources"]["limits"]
        assert limits.get("nvidia.com/gpu") == (str(gpu) if gpu else None)
        assert template["spec"]["terminationGracePeriodSeconds"] == math.ceil(spec.fault_tolerance.preemption_grace_s)
        assert template["spec"]["restartPolicy"] == "Never"
        assert template["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("api", APIS)
def test_the_gpu_example_spec_validates(api):
    spec = load_spec(GPU_EXAMPLE, [f"kubernetes.launch_api={api}"])
    config_map, workload = attempt_manifests(spec, RUN_ID, plan(2), IMAGE)
    validate(config_map)
    validate_workload(workload)
    assert workload["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "training"
    assert workload["spec"].get("runPolicy", workload["spec"])["suspend"] is True  # Kueue admits the whole gang
    for template in pod_templates(workload):
        pod = template["spec"]
        assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
        assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        [term] = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "topology.kubernetes.io/zone"
        assert term["labelSelector"]["matchLabels"] == {LABEL_RUN: RunNames(RUN_ID).base, LABEL_ATTEMPT: "2"}
        assert pod["imagePullSecrets"] == [{"name": "trainflow-registry"}]


def test_indexed_job_shape_and_failure_policy():
    spec = spec_for(4, 0, "indexed-job")
    _, job = attempt_manifests(spec, RUN_ID, plan(3), IMAGE)
    body = job["spec"]
    assert (body["completionMode"], body["parallelism"], body["completions"], body["backoffLimit"]) == (
        "Indexed",
        4,
        4,
        0,
    )
    rules = body["podFailurePolicy"]["rules"]
    assert len(rules) == len(FAILURE_RULES) and all(rule["action"] == "FailJob" for rule in rules)
    assert rules[0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    assert rules[-1]["onExitCodes"] == {"containerName": "trainer", "operator": "NotIn", "values": [0]}
    labels = job["metadata"]["labels"]
    assert labels[LABEL_RUN] == RunNames(RUN_ID).base and labels[LABEL_ATTEMPT] == "3"
    assert job["metadata"]["annotations"]["trainflow.dev/run-id"] == RUN_ID


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)


def pod_view(template: dict, node: int, pod_index: int) -> dict[str, str]:
    """The environment a pod of `node` ends up with, resolving the downward API like the kubelet."""
    env: dict[str, str] = {}
    for item in template["spec"]["containers"][0]["env"]:
        if "value" in item:
            env[item["name"]] = _expand(item["value"], env)
        else:
            path = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = str(node if "job-completion-index" in path else pod_index)
    return env


@pytest.mark.parametrize("api", APIS)
def test_each_pod_reads_its_own_worker_config(api):
    spec = spec_for(4, 0, api)
    config_secret, workload = attempt_manifests(spec, RUN_ID, plan(), IMAGE)
    if workload["kind"] == "PyTorchJob":
        replicas = workload["spec"]["pytorchReplicaSpecs"]
        pods = [(0, replicas["Master"]["template"], 0)] + [(i + 1, replicas["Worker"]["template"], i) for i in range(3)]
    else:
        [template] = pod_templates(workload)
        pods = [(node, template, node) for node in range(4)]
    seen = set()
    for node, template, index in pods:
        path = pod_view(template, node, index)["TRAINFLOW_WORKER_CONFIG"]
        key = path.removeprefix("/etc/trainflow/")
        config = json.loads(config_secret["stringData"][key])
        assert config["node"] == node and config["attempt"] == 1 and config["node_scratch"] == "/scratch/node"
        assert config["scratch_volume"] == "/scratch"  # the pod's emptyDir, where the agent makes it
        assert pod_view(template, node, index)["TRAINFLOW_RANK_RECORDS"] == "/scratch/node/ranks"
        assert config["status_address"] == "10.8.0.4:41234"
        seen.add(key)
    assert seen == set(config_secret["stringData"])


@pytest.mark.parametrize(
    "api, host",
    [
        ("indexed-job", "{job}-0.{svc}"),
        ("jobset", "{job}-node-0-0.{svc}"),
        ("pytorchjob", "{job}-master-0"),
    ],
)
def test_rendezvous_is_at_node_zeros_dns_name(api, host):
    spec = spec_for(2, 0, api)
    names = RunNames(RUN_ID)
    _, workload = attempt_manifests(spec, RUN_ID, plan(), IMAGE)
    command = pod_templates(workload)[0]["spec"]["containers"][0]["command"]
    endpoint = command[command.index("--rdzv-endpoint") + 1]
    assert endpoint == f"{host.format(job=names.workload(1), svc=names.service)}:{RENDEZVOUS_PORT}"
    assert command[command.index("--max-restarts") + 1] == "0"
    assert command[:3] == ["python", "-m", "trainflow.backends.agent"]  # the node agent: relay, plain copies


def test_headless_service_selects_the_worker_pods_and_publishes_before_ready():
    spec = spec_for(2, 0, "indexed-job")
    service = headless_service(spec, RUN_ID)
    _, job = attempt_manifests(spec, RUN_ID, plan(), IMAGE)
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert all(pod_labels[k] == v for k, v in service["spec"]["selector"].items())
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]


def test_long_run_ids_give_names_within_dns_limits():
    run_id = "a" * 42 + "-20250601-100000-abc123"
    spec = spec_for(4, 0, "jobset")
    names = RunNames(run_id)
    _, workload = attempt_manifests(spec, run_id, plan(101), IMAGE)
    longest_hostname = f"{names.workload(101)}-node-0-1023"
    assert len(longest_hostname) <= 63 and len(names.base) <= 40
    assert names.base != RunNames("a" * 42 + "-20250601-100000-abc124").base  # the hash keeps runs apart
    validate_workload(workload)


def test_secrets_are_referenced_by_name_never_inlined():
    spec = spec_for(2, 0, "indexed-job")
    config_map, job = attempt_manifests(spec, RUN_ID, plan(), IMAGE)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "trainflow-s3"}}]
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps(config_map) + json.dumps(job)


def test_kaniko_build_job_validates():
    spec = load_spec(GPU_EXAMPLE)
    image = ImageRef("registry.example.com/ml/trainflow", "tf-cuda-0123")
    job = kaniko_job(spec, RUN_ID, image, context_uri(spec, image))
    validate(job)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--destination=registry.example.com/ml/trainflow:tf-cuda-0123" in args
    assert "--context=s3://trainflow-checkpoints/_trainflow/build/tf-cuda-0123.tar.gz" in args
    assert "--digest-file=/dev/termination-log" in args and "--build-arg=TORCH_VARIANT=cuda" in args


@pytest.mark.parametrize("api", APIS)
def test_secret_env_reaches_the_pods_by_reference_only(api):
    spec = spec_for(2, 0, api, "workload.secret_env=[HF_TOKEN, WANDB_API_KEY]")
    values = {"HF_TOKEN": "hf-value-0123", "WANDB_API_KEY": "wandb-value-4567"}
    config_secret, workload = attempt_manifests(spec, RUN_ID, plan(), IMAGE, values)
    validate(config_secret)
    validate_workload(workload)
    assert config_secret["kind"] == "Secret"
    assert {config_secret["stringData"][f"env.{name}"] for name in values} == set(values.values())
    pods = json.dumps(workload)
    assert not any(value in pods for value in values.values())
    for template in pod_templates(workload):
        env = {item["name"]: item for item in template["spec"]["containers"][0]["env"]}
        for name in values:
            assert env[name] == {
                "name": name,
                "valueFrom": {"secretKeyRef": {"name": config_secret["metadata"]["name"], "key": f"env.{name}"}},
            }
        [volume] = [v for v in template["spec"]["volumes"] if v["name"] == "worker-config"]
        mounted = {item["key"] for item in volume["secret"]["items"]}
        assert mounted and not any(key.startswith("env.") for key in mounted)  # values only as env, not files


def test_a_secret_env_without_a_value_is_refused():
    spec = spec_for(2, 0, "indexed-job", "workload.secret_env=[HF_TOKEN]")
    with pytest.raises(ValueError, match="HF_TOKEN"):
        attempt_manifests(spec, RUN_ID, plan(), IMAGE, {})
