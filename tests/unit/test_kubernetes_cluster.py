"""KubeCluster, the one wrapper over the official client, against a small Kubernetes API stand-in
served over HTTP on loopback: discovery, create, list by label, get, foreground delete, pod logs,
namespace checks and the error messages people see."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from trainflow.backends.kubernetes.cluster import ClusterError, KubeCluster

VERBS = ["create", "delete", "get", "list"]
CORE = {
    "pods": "Pod",
    "services": "Service",
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "resourcequotas": "ResourceQuota",
}
GROUPS = {"batch/v1": {"jobs": "Job"}}
PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<gv>[^/]+/[^/]+))/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?P<log>/log)?$"
)


def status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": reason,
        "message": message,
        "code": code,
    }


class ApiServer(BaseHTTPRequestHandler):
    objects: dict = {}
    deletes: list = []
    namespaces = {"trainflow"}
    forbidden_namespaces = False

    def _send(self, code: int, body) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def do_GET(self):
        url = urlparse(self.path)
        discovery = {
            "/version": {"major": "1", "minor": "34", "gitVersion": "v1.34.0"},
            "/api": {"kind": "APIVersions", "versions": ["v1"]},
            "/apis": {
                "kind": "APIGroupList",
                "groups": [
                    {
                        "name": "batch",
                        "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
                        "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"},
                    }
                ],
            },
            "/api/v1": {
                "kind": "APIResourceList",
                "groupVersion": "v1",
                "resources": [
                    {"name": p, "singularName": "", "namespaced": True, "kind": k, "verbs": VERBS}
                    for p, k in CORE.items()
                ]
                + [
                    {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
                    {
                        "name": "namespaces",
                        "singularName": "",
                        "namespaced": False,
                        "kind": "Namespace",
                        "verbs": VERBS,
                    },
                ],
            },
            "/apis/batch/v1": {
                "kind": "APIResourceList",
                "groupVersion": "batch/v1",
                "resources": [{"name": "jobs", "singularName": "", "namespaced": True, "kind": "Job", "verbs": VERBS}],
            },
        }
        if url.path in discovery:
            return self._send(200, discovery[url.path])
        namespace = re.fullmatch(r"/api/v1/namespaces/([^/]+)", url.path)
        if namespace:
            if self.forbidden_namespaces:
                return self._send(403, status(403, "Forbidden", "namespaces is forbidden"))
            if namespace.group(1) in self.namespaces:
                return self._send(
                    200, {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": namespace.group(1)}}
                )
            return self._send(404, status(404, "NotFound", f'namespaces "{namespace.group(1)}" not found'))
        match = PATH.match(url.path)
        ns, plural, name = match["ns"], match["plural"], match["name"]
        if match["log"]:
            tail = parse_qs(url.query)["tailLines"][0]
            return self._send(200, f"last {tail} lines of {name}\n")
        if name:
            found = self.objects.get((plural, ns, name))
            return (
                self._send(200, found)
                if found
                else self._send(404, status(404, "NotFound", f'{plural} "{name}" not found'))
            )
        selector = parse_qs(url.query).get("labelSelector", [""])[0]
        wanted = dict(term.split("=") for term in selector.split(",") if term)
        items = [
            doc
            for (p, n, _), doc in self.objects.items()
            if p == plural and n == ns and wanted.items() <= doc["metadata"].get("labels", {}).items()
        ]
        return self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items})

    def do_POST(self):
        match = PATH.match(urlparse(self.path).path)
        doc = self._body()
        key = (match["plural"], match["ns"], doc["metadata"]["name"])
        if match["ns"] not in self.namespaces:
            return self._send(404, status(404, "NotFound", f'namespaces "{match["ns"]}" not found'))
        if key in self.objects:
            return self._send(409, status(409, "AlreadyExists", f'{match["plural"]} "{key[2]}" already exists'))
        if match["plural"] == "jobs" and "template" not in doc.get("spec", {}):
            return self._send(422, status(422, "Invalid", 'Job.batch "x" is invalid: spec.template: Required value'))
        self.objects[key] = doc
        self._send(201, doc)

    def do_DELETE(self):
        match = PATH.match(urlparse(self.path).path)
        options = self._body()
        self.deletes.append((match["plural"], match["name"], options))
        doc = self.objects.pop((match["plural"], match["ns"], match["name"]), None)
        if doc is None:
            return self._send(404, status(404, "NotFound", f'{match["plural"]} "{match["name"]}" not found'))
        self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    def log_message(self, *args):
        pass


@pytest.fixture
def api(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the dynamic client's discovery cache
    ApiServer.objects, ApiServer.deletes, ApiServer.forbidden_namespaces = {}, [], False
    server = ThreadingHTTPServer(("127.0.0.1", 0), ApiServer)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    configuration = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    yield KubeCluster(client.ApiClient(configuration))
    server.shutdown()
    server.server_close()


def config_map(name: str, **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "trainflow", "labels": labels},
        "data": {"node-0.json": "{}"},
    }


def test_create_list_get_and_delete_in_the_foreground(api):
    api.create(config_map("a", run="r1"))
    api.create(config_map("b", run="r2"))
    assert [d["metadata"]["name"] for d in api.list("v1", "ConfigMap", "trainflow", "run=r1")] == ["a"]
    assert api.get("v1", "ConfigMap", "trainflow", "b")["data"] == {"node-0.json": "{}"}
    assert api.get("v1", "ConfigMap", "trainflow", "missing") is None
    assert api.delete("v1", "ConfigMap", "trainflow", "a", grace_s=30) is True
    assert api.delete("v1", "ConfigMap", "trainflow", "a") is False
    assert ApiServer.deletes[0][2] == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "propagationPolicy": "Foreground",
        "gracePeriodSeconds": 30,
    }


def test_jobs_through_their_api_group(api):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "trainflow"},
        "spec": {"template": {"spec": {"containers": []}}},
    }
    api.create(job)
    assert api.list("batch/v1", "Job", "trainflow", "")[0]["metadata"]["name"] == "j"
    assert api.has_api("batch/v1", "Job") and not api.has_api("jobset.x-k8s.io/v1alpha2", "JobSet")


def test_errors_say_what_failed(api):
    api.create(config_map("a"))
    with pytest.raises(ClusterError, match='create ConfigMap trainflow/a: configmaps "a" already exists') as info:
        api.create(config_map("a"))
    assert info.value.status == 409
    bad_job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "trainflow"}, "spec": {}}
    with pytest.raises(ClusterError, match="spec.template: Required value"):
        api.create(bad_job)
    with pytest.raises(ClusterError, match="no JobSet API"):
        api.create(
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "metadata": {"name": "x", "namespace": "trainflow"},
            }
        )


def test_pod_log_asks_for_the_tail(api):
    assert api.pod_log("trainflow", "p-0", "trainer", 500) == "last 500 lines of p-0\n"


def test_namespace_check_tolerates_least_privilege(api):
    assert api.namespace_exists("trainflow") is True
    assert api.namespace_exists("elsewhere") is False
    ApiServer.forbidden_namespaces = True
    assert api.namespace_exists("trainflow") is None
