"""A new SQLite tracking store is set up by one process at a time."""

from __future__ import annotations

import fcntl
import threading

from mlflow.tracking import MlflowClient

from trainflow.reporting.tracking import Tracker


def test_a_new_sqlite_store_waits_while_another_process_sets_it_up(tmp_path):
    database = tmp_path / "mlflow.db"
    uri = f"sqlite:///{database}"
    made: list[Tracker] = []
    with open(tmp_path / "mlflow.db.setup-lock", "a") as held:  # another run setting the store up
        fcntl.flock(held, fcntl.LOCK_EX)
        opening = threading.Thread(target=lambda: made.append(Tracker(uri)))
        opening.start()
        opening.join(timeout=2.0)
        assert not database.exists() and not made  # it has not touched the store while the lock is held
        fcntl.flock(held, fcntl.LOCK_UN)
    opening.join(timeout=120)
    assert made and made[0].experiment_id("team-a")
    assert MlflowClient(uri).get_experiment_by_name("team-a") is not None
