"""infra/: the RBAC validates and is least privilege, the Prefect work-pool template renders (with
Prefect's own templating) to a Job that validates, the Helm values and the Dockerfile agree with
what the code and the README expect."""

from __future__ import annotations

import json

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prefect.utilities.templating import apply_values

from tests.conftest import ROOT
from trainflow.backends.kubernetes.image import CONTEXT_EXCLUDED, DOCKERFILE

INFRA = ROOT / "infra"
VERSIONS = ("1.31", "1.37")


def rbac() -> list[dict]:
    return [doc for doc in yaml.safe_load_all((INFRA / "rbac.yaml").read_text()) if doc]


@pytest.mark.parametrize("version", VERSIONS)
def test_rbac_validates(version):
    docs = rbac()
    assert [d["kind"] for d in docs] == ["ServiceAccount", "ServiceAccount", "Role", "RoleBinding"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_rbac_is_namespaced_and_least_privilege():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in rbac()}
    role = docs[("Role", "trainflow-orchestrator")]
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        assert not {"escalate", "bind", "impersonate", "watch", "update", "patch"} & set(rule["verbs"])
        if "secrets" in rule["resources"]:
            # existence checks and each attempt's own Secret, by name; never list every secret
            assert rule["resources"] == ["secrets"] and rule["verbs"] == ["get", "create", "delete"]
    binding = docs[("RoleBinding", "trainflow-orchestrator")]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "trainflow-orchestrator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "trainflow-orchestrator", "namespace": "trainflow"}
    ]
    assert docs[("ServiceAccount", "trainflow-worker")]["automountServiceAccountToken"] is False
    assert not any(d["kind"].startswith("Cluster") for d in rbac())


def work_pool_template() -> dict:
    return json.loads((INFRA / "prefect" / "base-job-template.json").read_text())


def render_flow_run_job(template: dict, **job_variables) -> dict:
    """What Prefect's Kubernetes worker creates for a flow run: defaults, then the deployment's
    job variables, applied with Prefect's own templating; env becomes a list the way the worker
    does it (its values first, then the template's)."""
    values = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    values |= job_variables
    configuration = apply_values(template["job_configuration"], values)
    manifest = configuration["job_manifest"]
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": k, "value": v} for k, v in configuration.get("env", {}).items()] + container["env"]
    if isinstance(container.get("args"), str):
        container["args"] = container["args"].split()
    return manifest


def test_work_pool_template_variables_are_a_valid_schema_with_valid_defaults():
    variables = work_pool_template()["variables"]
    jsonschema.Draft7Validator.check_schema(variables)
    defaults = {k: v["default"] for k, v in variables["properties"].items() if "default" in v}
    jsonschema.validate(defaults, variables)
    placeholders = json.dumps(work_pool_template()["job_configuration"])
    unused = [name for name in variables["properties"] if "{{ " + name + " }}" not in placeholders]
    assert not unused, f"variables no job configuration uses (Prefect would ignore them): {unused}"


@pytest.mark.parametrize("version", VERSIONS)
def test_work_pool_template_renders_to_a_valid_job(version):
    manifest = render_flow_run_job(
        work_pool_template(),
        name="digits-nightly",
        image="registry.example.com/ml/trainflow:tf-cpu-0123",
        command="prefect flow-run execute",
        env={"PREFECT_API_URL": "http://prefect-server.trainflow.svc.cluster.local:4200/api"},
        labels={"prefect.io/flow-run-id": "0b5b"},
    )
    pod = manifest["spec"]["template"]["spec"]
    # Prefect's worker insists on these two keys inside the pod spec (its base-manifest check);
    # the API server drops them with a warning, so they are removed before strict validation.
    assert (pod.pop("parallelism"), pod.pop("completions")) == (1, 1)
    kubernetes_validate.validate(manifest, version, strict=True)
    assert pod["serviceAccountName"] == "trainflow-orchestrator"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["TRAINFLOW_STATUS_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["PREFECT_API_URL"]["value"].startswith("http://prefect-server")


def test_work_pool_template_has_what_prefects_worker_requires():
    manifest = work_pool_template()["job_configuration"]["job_manifest"]
    pod = manifest["spec"]["template"]["spec"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    assert (pod["parallelism"], pod["completions"], pod["restartPolicy"]) == (1, 1, "Never")
    assert pod["containers"][0]["name"] == "prefect-job"
    assert manifest["spec"]["backoffLimit"] == 0  # retries belong to the flow, not to the Job


def test_helm_values_point_the_worker_at_the_template():
    values = yaml.safe_load((INFRA / "helm" / "prefect-worker-values.yaml").read_text())
    config = values["worker"]["config"]
    assert config["type"] == "kubernetes" and config["workPool"]
    configmap = config["baseJobTemplate"]["existingConfigMapName"]
    readme = (INFRA / "README.md").read_text()
    assert f"kubectl create configmap {configmap}" in readme
    assert "--from-file=baseJobTemplate.json=infra/prefect/base-job-template.json" in readme


def test_dockerfile_builds_from_the_lock_and_the_context_the_tag_hashes():
    dockerfile = (ROOT / DOCKERFILE).read_text()
    assert "COPY requirements.lock" in dockerfile and "pip install $extra -r requirements.lock" in dockerfile
    assert "ARG TORCH_VARIANT=cpu" in dockerfile and "USER 1000" in dockerfile
    ignored = {
        line.strip()
        for line in (INFRA / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {prefix.rstrip("/") for prefix in CONTEXT_EXCLUDED} <= ignored


def test_readme_says_ci_validates_manifests_but_runs_no_cluster():
    readme = (ROOT / "README.md").read_text()
    section = " ".join(readme[readme.index("## Backends") : readme.index("## Layout")].split())
    assert "CI validates" in section and "does not run a cluster" in section
