"""Does an attempt fit in the namespace's ResourceQuotas? Checked at provision, so a job that can
never be admitted fails at once with the numbers instead of waiting out the startup timeout."""

from __future__ import annotations

from decimal import Decimal

from trainflow.backends.kubernetes.pod import GPU_RESOURCE, cpu_quantity
from trainflow.runspec import RunSpec


def parse_quantity(text: str | int | float) -> Decimal:
    from kubernetes.utils import parse_quantity as parse

    return Decimal(parse(text))


def attempt_request(spec: RunSpec) -> dict[str, Decimal]:
    """What one attempt asks of a quota, under the names ResourceQuota uses."""
    nodes = spec.resources.nodes
    cpu = parse_quantity(cpu_quantity(spec.resources.cpu)) * nodes
    memory = parse_quantity(spec.resources.memory) * nodes
    request = {
        "pods": Decimal(nodes),
        "cpu": cpu,
        "requests.cpu": cpu,
        "limits.cpu": cpu,
        "memory": memory,
        "requests.memory": memory,
        "limits.memory": memory,
    }
    if spec.resources.gpu:
        request[f"requests.{GPU_RESOURCE}"] = Decimal(spec.resources.gpu * nodes)
    return request


def _show(resource: str, amount: Decimal) -> str:
    if "memory" in resource:
        return f"{amount / 2**30:.3g}Gi"
    return f"{amount.normalize():f}"


def quota_problems(quotas: list[dict], request: dict[str, Decimal]) -> list[str]:
    """One line per quota limit the attempt would exceed, with what it needs and what is left."""
    problems = []
    for quota in quotas:
        name = (quota.get("metadata") or {}).get("name", "?")
        status = quota.get("status") or {}
        hard = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}
        used = status.get("used") or {}
        for resource, limit in sorted(hard.items()):
            if resource not in request:
                continue
            left = parse_quantity(limit) - parse_quantity(used.get(resource, "0"))
            if request[resource] > left:
                problems.append(
                    f"resourcequota/{name}: {resource} needs {_show(resource, request[resource])}, "
                    f"{_show(resource, max(left, Decimal(0)))} of {_show(resource, parse_quantity(limit))} left"
                )
    return problems
