"""The tracking writer: calls in order, retried while the store refuses them, dropped (and counted)
once it has refused everything for longer than its patience, and healthy again when a write lands."""

from __future__ import annotations

import errno
import time

from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

from trainflow.reporting.tracking_writes import TrackingWrites, metric_name_problem


class Store:
    """A store that refuses writes with a full disk until it is told it has room."""

    def __init__(self):
        self.full = True
        self.written: list[int] = []

    def write(self, value: int) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.written.append(value)
        return value


def test_writes_are_retried_until_the_store_takes_them_in_order():
    store, writes = Store(), TrackingWrites(patience_s=60)
    queued = [writes.submit(lambda v=v: store.write(v), f"write {v}") for v in range(3)]
    time.sleep(0.5)
    assert store.written == [] and writes.fault() is None  # refused, but within the patience
    store.full = False
    assert writes.call(lambda: store.write(3), "write 3") == 3
    assert [future.result() for future in queued] == [0, 1, 2] and store.written == [0, 1, 2, 3]
    assert writes.dropped == 0 and writes.fault() is None


def test_a_store_refusing_longer_than_the_patience_is_down_and_its_writes_dropped():
    store, writes = Store(), TrackingWrites(patience_s=0.5)
    assert writes.call(lambda: store.write(1), "write 1") is None
    fault = writes.fault()
    assert fault is not None and "No space left on device" in fault and "0.5s" in fault
    started = time.monotonic()
    assert writes.call(lambda: store.write(2), "write 2") is None  # down: not retried
    assert time.monotonic() - started < 0.5 and writes.dropped == 2
    store.full = False
    time.sleep(0.1)
    writes._down_tried_at = 0.0  # as if the store had been down for a while: the next call is tried
    assert writes.call(lambda: store.write(3), "write 3") == 3
    assert writes.fault() is None


def test_a_call_the_store_refuses_for_good_is_dropped_at_once():
    writes = TrackingWrites(patience_s=60)

    def refused():
        raise MlflowException("Invalid value", error_code=INVALID_PARAMETER_VALUE)

    assert writes.call(refused, "a bad tag") is None
    assert writes.dropped == 1 and writes.fault() is None


def test_metric_names_mlflow_refuses():
    assert metric_name_problem("loss") is None and metric_name_problem("eval/acc top:1") is None
    assert "300 characters" in metric_name_problem("m" * 300)
    assert metric_name_problem("loss!") and metric_name_problem("../x") and metric_name_problem("/abs")
    assert metric_name_problem("a//b") and metric_name_problem("")
