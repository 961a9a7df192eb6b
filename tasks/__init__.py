"""Prefect tasks of the training lifecycle: small, typed, one stage each.

Task inputs are live handles (processes, sockets), so results are neither cached nor persisted. A
task run is named after its stage (with its attempt or step where the stage repeats), so the flow
run's graph reads as the lifecycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE


def lifecycle_task(*, name: str, task_run_name: str | Callable[[], str] | None = None, **options: Any):
    return task(name=name, task_run_name=task_run_name or name, cache_policy=NO_CACHE, persist_result=False, **options)
