"""Prefect tasks of the training lifecycle: small, typed, one stage each.

Task inputs are live handles (processes, sockets), so results are neither cached nor persisted.
"""

from __future__ import annotations

from functools import partial

from prefect import task
from prefect.cache_policies import NO_CACHE

lifecycle_task = partial(task, cache_policy=NO_CACHE, persist_result=False)
