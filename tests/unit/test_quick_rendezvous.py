"""torchrun's c10d rendezvous, tuned for trainflow's per-attempt rounds: polls and the cached round
state last at most the launcher's interval, the first join's spread stays within one poll, and
the event records' method names come without inspect.stack()."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rendezvous

from trainflow.backends import quick_rendezvous
from trainflow.backends.quick_rendezvous import install, poll_interval_s


@pytest.fixture
def installed(monkeypatch):
    holder = rendezvous._BackendRendezvousStateHolder
    for name in ("_delay", "get_method_name"):
        monkeypatch.setattr(rendezvous, name, getattr(rendezvous, name))  # restored after the test
    monkeypatch.setattr(holder, "__init__", holder.__init__)
    sleeps = []
    monkeypatch.setattr(quick_rendezvous.time, "sleep", sleeps.append)
    install(0.05)
    return sleeps


def test_polls_and_the_first_joins_spread_last_one_interval_at_most(installed):
    rendezvous._delay(seconds=1)
    for _ in range(50):
        rendezvous._delay(seconds=(0, 0.3))
    assert installed[0] == 0.05
    assert all(0.01 <= s <= 0.05 for s in installed[1:])


def test_the_round_state_is_cached_one_interval_at_most(installed):
    holder = rendezvous._BackendRendezvousStateHolder.__new__(rendezvous._BackendRendezvousStateHolder)
    rendezvous._BackendRendezvousStateHolder.__init__(holder, backend=object(), settings=None)
    assert holder._cache_duration == 0.05


def test_method_names_come_from_the_calling_frames(installed):
    def record():
        return rendezvous.get_method_name()

    def join_round():
        return record()

    assert join_round() == "join_round"


def test_the_interval_grows_with_the_node_count_up_to_torchruns_own():
    assert poll_interval_s(2) == 0.05
    assert poll_interval_s(10) == pytest.approx(0.2)
    assert poll_interval_s(1000) == 1.0
