"""trainflow's Prefect events, and the automation that notifies someone when a run fails.

Every event concerns one trainflow run (resource `trainflow.run.<run id>`) and names the Prefect
flow run and the MLflow run as related resources, so an automation can match on either.

This is glue for the `trainflow automation` command: Prefect is imported where it is used, so the
library stays importable inside workers without it.
"""

from __future__ import annotations

ATTEMPT_FAILED = "trainflow.attempt.failed"
ATTEMPT_RECOVERED = "trainflow.attempt.recovered"
ATTEMPT_RESIZED = "trainflow.attempt.resized"  # stopped at a checkpoint to grow back: no failure, no notification
CHECKPOINT_COMMITTED = "trainflow.checkpoint.committed"
RUN_SUCCEEDED = "trainflow.run.succeeded"
RUN_FAILED = "trainflow.run.failed"
FAILURE_EVENTS = (ATTEMPT_FAILED, RUN_FAILED)

RESOURCE_PREFIX = "trainflow.run."
DEFAULT_NAME = "trainflow-failures"
WEBHOOK_BLOCK_NAME = "trainflow-failures"

SUBJECT = "trainflow: {{ event.event }} ({{ event.resource.name }})"
BODY = (
    "{{ event.event }} for run {{ event.resource.name }} at {{ event.occurred }}\n"
    "{% if event.payload.attempt %}attempt {{ event.payload.attempt }}: {{ event.payload.outcome }}\n{% endif %}"
    "{{ event.payload.reason }}\n"
    "{% if event.payload.retry is defined %}retrying: {{ event.payload.retry }}\n{% endif %}"
    "MLflow run: {{ event.payload.mlflow_url or event.payload.mlflow_run_id }}\n"
    "{% if event.payload.prefect_url %}Prefect flow run: {{ event.payload.prefect_url }}\n{% endif %}"
)


class AutomationError(ValueError):
    """The automation cannot be installed as asked (unknown block, bad URL)."""


def failure_trigger():
    """Fire on every failed attempt and every failed run, one notification per event."""
    from prefect.events.schemas.automations import EventTrigger, Posture

    return EventTrigger(
        expect=set(FAILURE_EVENTS),
        match={"prefect.resource.id": f"{RESOURCE_PREFIX}*"},
        posture=Posture.Reactive,
        threshold=1,
        within=0,
    )


def _webhook_block(url: str):
    """A custom-webhook notification block posting {subject, text} as JSON to `url`."""
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    if not url.startswith(("http://", "https://")):
        raise AutomationError(f"--webhook-url: {url!r} is not an http(s) URL")
    block = CustomWebhookNotificationBlock(
        name=WEBHOOK_BLOCK_NAME, url=url, json_data={"subject": "{{subject}}", "text": "{{body}}"}
    )
    block_id = block.save(WEBHOOK_BLOCK_NAME, overwrite=True)
    return block_id, f"custom-webhook/{WEBHOOK_BLOCK_NAME}"


def _existing_block(slug: str):
    """The notification block `type-slug/name` the user configured (UI: Blocks, or `prefect block create`)."""
    from prefect.blocks.core import Block
    from prefect.blocks.notifications import NotificationBlock

    try:
        block = Block.load(slug)
    except (ValueError, KeyError) as exc:
        raise AutomationError(f"--block {slug}: no such block ({exc}); create it in the Prefect UI (Blocks)") from None
    if not isinstance(block, NotificationBlock):
        raise AutomationError(f"--block {slug}: {type(block).__name__} is not a notification block")
    return block._block_document_id, slug


def install(name: str = DEFAULT_NAME, webhook_url: str | None = None, block: str | None = None) -> dict:
    """Create (or replace) the automation `name` that notifies through a webhook or a block."""
    from prefect.automations import AutomationCore, SendNotification
    from prefect.client.orchestration import get_client

    if (webhook_url is None) == (block is None):
        raise AutomationError("give exactly one of --webhook-url URL or --block TYPE/NAME")
    if webhook_url is not None:
        block_id, block_slug = _webhook_block(webhook_url)
    else:
        assert block is not None  # exactly one of the two, checked above
        block_id, block_slug = _existing_block(block)
    automation = AutomationCore(
        name=name,
        description="Notify when a trainflow attempt or run fails (installed by `trainflow automation install`).",
        trigger=failure_trigger(),
        actions=[SendNotification(block_document_id=block_id, subject=SUBJECT, body=BODY)],
    )
    with get_client(sync_client=True) as client:
        for existing in client.read_automations_by_name(name=name):  # installing twice leaves one
            client.delete_automation(existing.id)
        automation_id = client.create_automation(automation)
    return {"automation_id": str(automation_id), "name": name, "block": block_slug, "events": list(FAILURE_EVENTS)}
