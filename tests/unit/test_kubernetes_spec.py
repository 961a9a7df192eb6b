"""The spec's `kubernetes:` section: optional with defaults, strict like the other sections, and
what a Kubernetes run needs checked before anything is provisioned."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from trainflow.spec import LaunchApi, SpecError, load_spec

LOCAL = ROOT / "examples" / "digits" / "spec.yaml"
K8S = ROOT / "examples" / "specs" / "digits-kubernetes.yaml"
GPU = ROOT / "examples" / "specs" / "digits-kubernetes-gpu.yaml"


def test_a_local_spec_gets_harmless_defaults():
    k8s = load_spec(LOCAL).kubernetes
    assert (k8s.namespace, k8s.launch_api, k8s.image, k8s.s3_secret) == ("default", LaunchApi.indexed_job, None, None)


def test_the_example_specs_load():
    assert load_spec(K8S).kubernetes.launch_api == LaunchApi.indexed_job
    gpu = load_spec(GPU)
    assert gpu.kubernetes.tolerations[0].model_dump(by_alias=True, exclude_none=True) == {
        "key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_toleration_seconds_is_written_as_in_kubernetes():
    spec = load_spec(K8S, ['kubernetes.tolerations=[{key: node.kubernetes.io/unreachable, operator: Exists, '
                           'effect: NoExecute, tolerationSeconds: 30}]'])
    assert spec.kubernetes.tolerations[0].toleration_seconds == 30


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
