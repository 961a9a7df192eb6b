"""The spec's `kubernetes:` section: optional with defaults, strict like the other sections, and
what a Kubernetes run needs checked before anything is provisioned."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from trainflow.backends.kubernetes.config import KubernetesConfig, LaunchApi, kubernetes_config
from trainflow.runspec import SpecError, load_spec

LOCAL = ROOT / "examples" / "digits" / "spec.yaml"
K8S = ROOT / "examples" / "specs" / "digits-kubernetes.yaml"
GPU = ROOT / "examples" / "specs" / "digits-kubernetes-gpu.yaml"


def test_a_local_spec_records_the_section_at_its_defaults():
    recorded = load_spec(LOCAL).model_dump(mode="json")["kubernetes"]
    assert recorded == KubernetesConfig().model_dump(mode="json", exclude={"backend"})
    assert (recorded["namespace"], recorded["launch_api"], recorded["image"]) == ("default", "indexed-job", None)


def test_the_example_specs_load():
    assert kubernetes_config(load_spec(K8S)).launch_api == LaunchApi.indexed_job
    gpu = load_spec(GPU)
    assert kubernetes_config(gpu).tolerations[0].model_dump(by_alias=True, exclude_none=True) == {
        "key": "nvidia.com/gpu",
        "operator": "Exists",
        "effect": "NoSchedule",
    }


def test_toleration_seconds_is_written_as_in_kubernetes():
    spec = load_spec(
        K8S,
        [
            "kubernetes.tolerations=[{key: node.kubernetes.io/unreachable, operator: Exists, "
            "effect: NoExecute, tolerationSeconds: 30}]"
        ],
    )
    assert kubernetes_config(spec).tolerations[0].toleration_seconds == 30


@pytest.mark.parametrize(
    "override, message",
    [
        ("kubernetes.replicas=3", "kubernetes.replicas: unknown key"),
        ("kubernetes.launch_api=mpijob", "kubernetes.launch_api"),
        ("kubernetes.namespace=Team_A", "kubernetes.namespace"),
        ("kubernetes.local_tier_volume=lots", "kubernetes.local_tier_volume"),
        ("kubernetes.tolerations=[{operator: Equal, value: x}]", "a toleration without a key needs operator: Exists"),
        ("checkpoint.uri=checkpoints/digits", "checkpoint.uri: the kubernetes backend needs an s3:// URI"),
        ("kubernetes.image=null", "kubernetes.image: required with resources.backend: kubernetes"),
    ],
)
def test_bad_kubernetes_settings_name_the_field(override, message):
    with pytest.raises(SpecError) as info:
        load_spec(K8S, [override])
    assert message in str(info.value)


def test_the_section_is_part_of_the_spec_hash():
    assert load_spec(K8S).spec_hash() != load_spec(K8S, ["kubernetes.launch_api=jobset"]).spec_hash()
