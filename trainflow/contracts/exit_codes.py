"""Exit codes a worker uses to say why it stopped; the orchestrator and pod failure policies read them.

A leaf outside trainflow.runtime: reading them must not import the runtime (torch) into the orchestrator."""

ORCHESTRATOR_LOST = 75  # the status channel was unreachable for orchestrator_timeout_s
STORE_UNREACHABLE = 76  # a node's agent could not restore a plain script's checkpoint from the store
PREEMPTED = 83  # SIGTERM: the emergency checkpoint is committed, nothing to lose
DIVERGED = 84  # data-parallel replicas disagreed on their parameters
