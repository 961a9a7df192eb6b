"""Ties a run's objects to the orchestrator's pod, so that if that pod is deleted for good (the
flow run crashed and never ran teardown) the cluster's garbage collector removes the training job
instead of leaving it running. The work-pool template passes the pod's identity through the
downward API; outside a pod there is no owner and teardown alone cleans up."""

from __future__ import annotations

import os

POD_NAME_ENV = "TRAINFLOW_POD_NAME"
POD_UID_ENV = "TRAINFLOW_POD_UID"
POD_NAMESPACE_ENV = "TRAINFLOW_POD_NAMESPACE"


def orchestrator_owner(namespace: str) -> dict | None:
    """The owner reference to the orchestrator's pod, when it runs in `namespace`."""
    name, uid = os.environ.get(POD_NAME_ENV), os.environ.get(POD_UID_ENV)
    # an owner in another namespace counts as absent: the collector would delete the objects at once
    if not (name and uid) or os.environ.get(POD_NAMESPACE_ENV) != namespace:
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


def owned(doc: dict, owner: dict | None) -> dict:
    if owner is not None:
        doc["metadata"]["ownerReferences"] = [dict(owner)]
    return doc
