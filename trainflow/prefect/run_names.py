"""Flow run names. A name a person gave a run stays the run's name; trainflow names the others.

A person names a run when creating it from a deployment: the UI's run form (which offers a name to
keep or change), `prefect deployment run --flow-run-name`, the API. A run that a deployment's
schedule made, a subflow, or a flow called directly (`trainflow run`) has a name nobody chose, so
trainflow gives it one: the spec's name until the run id is known, then the run id. Where the
person's name stays, the run id goes beside it as a tag.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.context import FlowRunContext

RUN_ID_TAG = "run-id:"


def named_by_a_person(run: FlowRun) -> bool:
    """Whether the run's name was a person's choice (see the module's docstring)."""
    return run.deployment_id is not None and not run.auto_scheduled


def given_or(template: str) -> Callable[[], str]:
    """A flow's `flow_run_name`: the person's name for the run, else `template` filled in with the
    run's parameters, as a template given to Prefect directly would be."""

    def name() -> str:
        context = FlowRunContext.get()
        run = context.flow_run if context else None
        if run is not None and named_by_a_person(run):
            return run.name
        return template.format(**((context.parameters if context else None) or {}))

    name.__name__ = f"given_or({template!r})"
    return name


def name_for_run_id(flow_run_id: str, run_id: str) -> str:
    """Name the flow run after the trainflow run id, unless a person named it: then the run id
    becomes one of its tags. Returns what was done, for the log."""
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(flow_run_id))
        if named_by_a_person(run):
            tag = f"{RUN_ID_TAG}{run_id}"
            if tag not in run.tags:
                client.update_flow_run(run.id, tags=[*run.tags, tag])
            return f"kept the name {run.name!r}, tagged {tag}"
        client.set_flow_run_name(run.id, run_id)
        return f"named {run_id}"
