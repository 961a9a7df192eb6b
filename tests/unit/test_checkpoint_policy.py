"""When a checkpoint is also a snapshot to the durable store."""

from __future__ import annotations

from trainflow.checkpoint.policy import SnapshotPolicy


def test_zero_interval_snapshots_every_checkpoint():
    policy = SnapshotPolicy(snapshot_every_s=0)
    policy.started(now=100.0)
    assert all(policy.wants_snapshot(step, commit=False, now=100.0) for step in (20, 40, 60))


def test_first_checkpoint_of_an_attempt_is_a_snapshot():
    assert SnapshotPolicy(snapshot_every_s=600).wants_snapshot(20, commit=False, now=5.0)


def test_interval_between_snapshots():
    policy = SnapshotPolicy(snapshot_every_s=60)
    policy.started(now=1000.0)
    assert not policy.wants_snapshot(40, commit=False, now=1059.0)
    assert policy.wants_snapshot(60, commit=False, now=1060.0)


def test_commit_and_kept_steps_always_go():
    policy = SnapshotPolicy(snapshot_every_s=600, keep_every_steps=100)
    policy.started(now=0.0)
    assert policy.wants_snapshot(37, commit=True, now=1.0)  # the last step, an emergency checkpoint
    assert policy.wants_snapshot(200, commit=False, now=1.0)  # retention keeps it for good
    assert not policy.wants_snapshot(220, commit=False, now=1.0)


def test_without_a_local_tier_every_checkpoint_is_a_snapshot():
    policy = SnapshotPolicy(snapshot_every_s=600, local_tier=False)
    policy.started(now=0.0)
    assert policy.wants_snapshot(20, commit=False, now=1.0)
