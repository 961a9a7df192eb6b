"""The Kubernetes backend with pods that really run: the lifecycle flow, the real launcher and its
rendered manifests, against a cluster whose Job controller and kubelets run each pod on this
machine in namespaces of its own, as the image's user, with its volumes (tests/kubernetes/
running_cluster.py). No cluster is needed; the API server itself is the in-memory one of the unit
tests, so what these prove is what runs inside the pods: trainflow's node agent as the pod's
command, its status relay, and a plain script's own checkpoints restored into a new pod."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import torch
from prefect.logging.handlers import APILogHandler
from prefect.settings import PREFECT_API_URL, temporary_settings

import tasks.provision
from flows.lifecycle import training_lifecycle
from tests.integration.conftest import unique_prefix
from tests.kubernetes.running_cluster import RunningCluster
from tests.servers import BIN, BUCKET, s3_environment, start_server
from trainflow import backends
from trainflow.backends.kubernetes.launcher import KubernetesLauncher
from trainflow.backends.kubernetes.workloads import JOBSET_API, PYTORCHJOB_API
from trainflow.backends.netns import NodeNetwork
from trainflow.backends.ports import free_port
from trainflow.checkpoint.catalog import latest_verified
from trainflow.checkpoint.storage import open_storage
from trainflow.contracts.status_protocol import NodeHello
from trainflow.drills.servers import stop_server
from trainflow.orchestrator.status import StatusServer
from trainflow.runspec import RunSpec

pytestmark = pytest.mark.integration

NODES = 2
DIGEST = "sha256:" + "7" * 64
S3_SECRET = "trainflow-s3"


@pytest.fixture(scope="module")
def pod_network():
    """Two machines for pods, and a bridge the orchestrator (this process) listens on."""
    network = NodeNetwork(f"kubernetes-pods-{os.getpid()}", NODES)
    network.create()
    yield network
    assert network.destroy() == []


@pytest.fixture(scope="module")
def pod_s3(pod_network, tmp_path_factory) -> str:
    """An S3 endpoint the pods reach: moto on the bridge's address."""
    endpoint = f"http://{pod_network.host_address}:{free_port()}"
    host, port = endpoint.removeprefix("http://").split(":")
    proc = start_server(
        [str(BIN / "moto_server"), "-H", host, "-p", port],
        dict(os.environ),
        tmp_path_factory.mktemp("pod-moto") / "moto.log",
        f"{endpoint}/moto-api/",
        timeout_s=60,
    )
    env = s3_environment(endpoint)
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    ).create_bucket(Bucket=BUCKET)
    yield endpoint
    stop_server(proc)


@pytest.fixture
def on_pods(pod_network, pod_s3, prefect_api, tmp_path, monkeypatch):
    """Run the lifecycle on the kubernetes backend, its pods on this machine; returns the summary,
    the cluster, and every stream the status channel opened: (kind, node, the peer's address)."""
    s3_env = s3_environment(pod_s3)
    for name, value in {**s3_env, "TRAINFLOW_HOME": str(tmp_path / "home")}.items():
        monkeypatch.setenv(name, value)
    cluster = RunningCluster(pod_network, tmp_path / "pods", crds=(JOBSET_API, PYTORCHJOB_API))
    cluster.add(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": S3_SECRET, "namespace": "trainflow"},
            "stringData": s3_env,
        }
    )
    launcher = KubernetesLauncher(cluster, poll_interval_s=0.2, delete_timeout_s=60, registry=lambda repo, tag: DIGEST)
    monkeypatch.setitem(backends._REGISTRY, "kubernetes", lambda: launcher)
    streams: list[tuple[str, int, str]] = []

    class Channel(StatusServer):
        def _open_stream(self, hello, peer):
            streams.append((type(hello).__name__, hello.node, peer.rsplit(":", 1)[0]))
            return super()._open_stream(hello, peer)

    monkeypatch.setattr(tasks.provision, "StatusServer", Channel)

    def run(workload: dict, uri: str, every_steps: int = 10, launch_api="indexed-job", **fault_tolerance) -> dict:
        spec = RunSpec.model_validate(
            {
                "name": "pods-here",
                "seed": 1234,
                "workload": workload,
                "resources": {"backend": "kubernetes", "nodes": NODES, "procs_per_node": 1, "cpu": 1, "memory": "2Gi"},
                "checkpoint": {"uri": uri, "every_steps": every_steps, "keep_last": 3},
                "fault_tolerance": {"max_restarts": 2, "backoff_s": 0, "preemption_grace_s": 10, **fault_tolerance},
                "kubernetes": {
                    "namespace": "trainflow",
                    "image": "registry.example.com/ml/trainflow:pods-here",
                    "s3_secret": S3_SECRET,
                    "status_host": pod_network.host_address,
                    "launch_api": launch_api,
                },
                "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "pods-here"},
            }
        )
        with temporary_settings({PREFECT_API_URL: prefect_api}):  # the session's server, not a temporary one
            state = training_lifecycle(spec, return_state=True)
            APILogHandler().flush()  # the flow's logs reach the server while it is there
        summary = state.result(raise_on_failure=False)
        assert isinstance(summary, dict), summary
        return summary

    yield run, cluster, streams
    cluster.close()
    assert cluster.sandboxes == {}, "pods left running"
    left = [p["metadata"]["name"] for p in cluster.pods_run if (tmp_path / "pods" / p["metadata"]["name"]).exists()]
    assert left == [], f"pod folders left behind: {left}"


def pod_addresses(network: NodeNetwork) -> set[str]:
    return {network.node_address(node) for node in range(NODES)}


def test_pods_run_the_node_agent_whose_relay_speaks_for_their_ranks_and_a_crash_resumes_in_new_pods(
    on_pods, pod_network
):
    run, cluster, streams = on_pods
    uri = unique_prefix()
    args = ["--fail-at-step", "12", "--in-attempt", "1"]  # rank 1 (node 1's) exits 3 at step 12 of attempt 1
    summary = run({"entrypoint": "tests/integration/workloads/fail_once.py", "args": args, "steps": 30}, uri)
    attempts = summary["attempts"]
    assert [a["outcome"] for a in attempts] == ["CRASHED", "SUCCEEDED"], [a["reason"] for a in attempts]
    assert "rank 1" in attempts[0]["reason"] and "code 3" in attempts[0]["reason"], attempts[0]["reason"]
    # the new pods' local tier is empty: the shards of step 10 came from S3
    assert attempts[1]["resumed_from_step"] == 10, attempts[1]
    commands = {tuple(pod["spec"]["containers"][0]["command"][:3]) for pod in cluster.pods_run}
    assert commands == {("python", "-m", "trainflow.backends.agent")}
    assert len(cluster.pods_run) == 2 * NODES
    # one stream per pod, its relay's, from the pod's own address; no rank dialed the orchestrator
    relays = [(NodeHello.__name__, node, pod_network.node_address(node)) for node in range(NODES)]
    assert sorted(streams) == sorted(relays * 2)
    final = latest_verified(open_storage(uri), summary["run_id"])
    assert final is not None and final.step == 30


@pytest.mark.parametrize(("launch_api", "kind"), [("jobset", "JobSet"), ("pytorchjob", "PyTorchJob")])
def test_the_pods_of_every_launch_api_run_the_node_agent(on_pods, pod_network, launch_api, kind):
    run, cluster, streams = on_pods
    uri = unique_prefix()
    summary = run({"entrypoint": "examples/digits/train.py", "steps": 10}, uri, every_steps=5, launch_api=launch_api)
    assert [a["outcome"] for a in summary["attempts"]] == ["SUCCEEDED"], summary["attempts"]
    assert {pod["metadata"]["labels"]["fake/owner"].split("/")[0] for pod in cluster.pods_run} == {kind}
    relays = [(NodeHello.__name__, node, pod_network.node_address(node)) for node in range(NODES)]
    assert sorted(streams) == relays
    assert latest_verified(open_storage(uri), summary["run_id"]).step == 10


def test_a_plain_script_in_a_new_pod_resumes_from_its_own_checkpoint_copied_to_s3(on_pods, pod_network, tmp_path):
    run, cluster, streams = on_pods
    uri = unique_prefix()
    out = "/scratch/out"  # the pod's emptyDir: a retry's pod starts with it empty
    args = ["--out_dir", out, "--max_iters", "60", "--ckpt_every", "10", "--fail-in-attempt", "1"]
    # past the start-up window by construction: the failing rank waits until its process is 2 s old
    args += ["--fail-at-iter", "30", "--fail-not-before-s", "2", "--fail-once-copied-to", uri]
    workload = {
        "entrypoint": "tests/integration/workloads/plain_nanogpt.py",
        "args": args,
        "steps": 60,
        "mode": "plain",
        "plain": {"checkpoint_dir": out, "resume_args": ["--init_from=resume"]},
    }
    summary = run(workload, uri, plain_startup_window_s=1)
    attempts = summary["attempts"]
    assert [a["outcome"] for a in attempts] == ["CRASHED", "SUCCEEDED"], [a["reason"] for a in attempts]
    # the pod's log names the rank, as torchrun's report does on the other backends; not its last line
    assert "rank 0 on node 0 exited with code 1" in attempts[0]["reason"]
    assert "failing at iteration 30" not in attempts[0]["reason"]
    restored = attempts[1]["resumed_from"]
    assert restored and restored.startswith(f"{uri}/{summary['run_id']}/step-"), attempts[1]
    storage = open_storage(uri)
    final = latest_verified(storage, summary["run_id"])  # copied from node 0's new pod once all exited 0
    local = tmp_path / "final" / "ckpt.pt"
    storage.download(f"{final.prefix}/ckpt.pt", local)
    last = torch.load(local, weights_only=True)
    assert last["iter_num"] == 60
    [first_start, second_start] = last["starts"]
    assert first_start == [1, 0] and second_start[0] == 2 and 10 <= second_start[1] <= 30, last["starts"]
    # each attempt ran in pods of its own: the second attempt's pods began with empty volumes
    assert len({pod["metadata"]["name"] for pod in cluster.pods_run}) == 2 * NODES
    assert sorted({(kind, node) for kind, node, _ in streams}) == [(NodeHello.__name__, n) for n in range(NODES)]
    assert {peer for _, _, peer in streams} == pod_addresses(pod_network)


CONFIG_ITEMS = {"secretName": "s", "items": [{"key": "node-0.json", "path": "node-0.json"}]}


def test_the_pods_run_as_the_images_user_in_a_root_of_their_own(pod_network, tmp_path):
    """What the sandbox gives a pod, checked from inside one: so the tests above prove what a pod
    would do, not what a root process on this machine could."""
    from tests.kubernetes.pod_sandbox import PodSandbox

    probe = (
        "import os, socket; "
        "print(os.getuid(), os.getpid(), socket.gethostname(), oct(os.stat('/scratch').st_mode & 0o7777), "
        "os.access('/app', os.W_OK), sorted(os.listdir('/etc/trainflow')), os.environ['INDEX'], os.environ['CONFIG'])"
    )
    pod = {
        "metadata": {"name": "probe-0-x", "namespace": "trainflow", "annotations": {"index": "0"}},
        "spec": {
            "hostname": "probe-0",
            "subdomain": "run",
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example.com/ml/trainflow:pods-here",
                    "workingDir": "/app",
                    "command": [sys.executable.rsplit("/", 1)[-1], "-c", probe],
                    "env": [
                        {"name": "INDEX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['index']"}}},
                        {"name": "CONFIG", "value": "/etc/trainflow/node-$(INDEX).json"},
                    ],
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/trainflow", "readOnly": True},
                        {"name": "scratch", "mountPath": "/scratch"},
                    ],
                }
            ],
            "volumes": [
                {"name": "config", "secret": CONFIG_ITEMS},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }
    sandbox = PodSandbox(pod, tmp_path / "probe", pod_network, 0, {}, lambda name: {"node-0.json": "{}"})
    sandbox.start()
    sandbox.process.wait(timeout=60)
    output = sandbox.log_tail(5)
    assert sandbox.exit_code == 0, output
    uid, pid, hostname, scratch_mode, app_writable, configs, index, config = output.split()
    assert (uid, pid, hostname) == ("1000", "1", "probe-0")  # the image's user; PID 1 of its own; the pod's name
    assert (scratch_mode, app_writable) == ("0o777", "False")  # an emptyDir as the kubelet makes it; the image's code
    assert (configs, index, config) == ("['node-0.json']", "0", "/etc/trainflow/node-0.json")
    sandbox.stop(0)
    assert not (tmp_path / "probe").exists()
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=True).stdout
    assert str(tmp_path) not in mounts and not Path("/scratch").exists()  # nothing of the pod outside it
