"""The only module that talks to the Kubernetes API: a handful of calls on plain dicts.

Everything else in the backend takes a `Cluster`, so tests drive it with recorded objects. The
real one uses the official client's dynamic API (built-in kinds and CRDs alike), configured from
the pod's service account in the cluster, or from KUBECONFIG outside it.
"""

from __future__ import annotations

from typing import Any, Protocol

REQUEST_TIMEOUT_S = 30  # a stuck API server must not stall the watcher forever


class ClusterError(RuntimeError):
    """A Kubernetes API call failed; the message says which call and what to check."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class Cluster(Protocol):
    def has_api(self, api_version: str, kind: str) -> bool: ...

    def namespace_exists(self, namespace: str) -> bool | None:
        """None when this identity may not read namespaces (least privilege)."""

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None: ...

    def list(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict]: ...

    def create(self, doc: dict) -> dict: ...

    def delete(self, api_version: str, kind: str, namespace: str, name: str, grace_s: int | None = None) -> bool:
        """Foreground deletion; False when it was already gone."""

    def pod_log(self, namespace: str, name: str, container: str, tail_lines: int) -> str: ...


def _explain(call: str, exc: Any) -> ClusterError:
    status = getattr(exc, "status", None)
    summary = exc.summary() if hasattr(exc, "summary") else str(exc)
    if status == 403:
        hint = "the service account lacks this permission: apply infra/rbac.yaml to the namespace"
    elif status == 401:
        hint = "the cluster did not accept the credentials: check KUBECONFIG or the pod's service account"
    else:
        hint = ""
    return ClusterError(f"{call}: {summary}" + (f" ({hint})" if hint else ""), status)


class KubeCluster:
    """`Cluster` over the official `kubernetes` client."""

    def __init__(self, api_client: Any = None):
        from kubernetes import client, config, dynamic

        if api_client is None:
            try:
                config.load_incluster_config()
                api_client = client.ApiClient()
            except config.ConfigException:
                try:
                    api_client = config.new_client_from_config()
                except (config.ConfigException, OSError) as exc:
                    raise ClusterError(
                        f"no Kubernetes cluster configured ({exc}): "
                        "run in a pod with a service account or set KUBECONFIG"
                    ) from None
        self._core = client.CoreV1Api(api_client)
        self._dynamic = dynamic.DynamicClient(api_client)

    def _resource(self, api_version: str, kind: str):
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        try:
            return self._dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            raise ClusterError(f"the cluster has no {kind} API ({api_version}): is its CRD installed?", 404) from None

    def has_api(self, api_version: str, kind: str) -> bool:
        try:
            self._resource(api_version, kind)
            return True
        except ClusterError:
            return False

    def namespace_exists(self, namespace: str) -> bool | None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._core.read_namespace(namespace, _request_timeout=REQUEST_TIMEOUT_S)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status == 403:
                return None
            raise _explain(f"get namespace {namespace}", exc) from None

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict | None:
        from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError

        try:
            resource = self._resource(api_version, kind)
            return resource.get(name=name, namespace=namespace, _request_timeout=REQUEST_TIMEOUT_S).to_dict()
        except NotFoundError:
            return None
        except DynamicApiError as exc:
            raise _explain(f"get {kind} {namespace}/{name}", exc) from None

    def list(self, api_version: str, kind: str, namespace: str, selector: str) -> list[dict]:
        from kubernetes.dynamic.exceptions import DynamicApiError

        try:
            resource = self._resource(api_version, kind)
            found = resource.get(namespace=namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT_S)
            found = found.to_dict()
        except DynamicApiError as exc:
            raise _explain(f"list {kind} in {namespace} ({selector})", exc) from None
        return found.get("items") or []

    def create(self, doc: dict) -> dict:
        from kubernetes.dynamic.exceptions import DynamicApiError

        meta = doc["metadata"]
        try:
            resource = self._resource(doc["apiVersion"], doc["kind"])
            created = resource.create(body=doc, namespace=meta.get("namespace"), _request_timeout=REQUEST_TIMEOUT_S)
            return created.to_dict()
        except DynamicApiError as exc:
            raise _explain(f"create {doc['kind']} {meta.get('namespace')}/{meta.get('name')}", exc) from None

    def delete(self, api_version: str, kind: str, namespace: str, name: str, grace_s: int | None = None) -> bool:
        from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError

        options: dict = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
        if grace_s is not None:
            options["gracePeriodSeconds"] = grace_s
        try:
            resource = self._resource(api_version, kind)
            resource.delete(name=name, namespace=namespace, body=options, _request_timeout=REQUEST_TIMEOUT_S)
            return True
        except NotFoundError:
            return False
        except DynamicApiError as exc:
            raise _explain(f"delete {kind} {namespace}/{name}", exc) from None

    def pod_log(self, namespace: str, name: str, container: str, tail_lines: int) -> str:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._core.read_namespaced_pod_log(
                name, namespace, container=container, tail_lines=tail_lines, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as exc:
            raise _explain(f"read the log of pod {namespace}/{name}", exc) from None
