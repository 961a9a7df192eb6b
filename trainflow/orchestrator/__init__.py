"""The orchestrator's side of a running attempt: the status channel, the watcher, the failure policy,
step metrics, live run parts, progress and the orphan reaper."""
