"""The node side of the status channel: a rank's link to its node's relay, and the relay that
folds its node's ranks into one stream to the orchestrator (protocol:
trainflow/contracts/status_protocol.py). Stdlib only: ranks and agents import it."""
