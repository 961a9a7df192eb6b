"""An exception nobody caught in the training script is told to the orchestrator (type, message,
traceback, step) and to torchrun's own error file, so both name the cause, before the process dies."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

from trainflow.contracts.status_protocol import Error
from trainflow.runtime.exit_deadline import end_within
from trainflow.runtime.reporter import StatusReporter

_reporting: list = []  # the current run's (reporter, flush, step): a script run again in place has new ones


def report_uncaught_errors(reporter: StatusReporter, flush: Callable[[], None], step: Callable[[], int]) -> None:
    """`flush` sends the steps not reported yet; `step` says the step the error happened at. The hook
    is installed once per process; a later call (the script run again in place) only rebinds it."""
    first = not _reporting
    _reporting[:] = [reporter, flush, step]
    if first:
        _install(sys.excepthook)


def _install(previous) -> None:
    def report(kind, value, tb):
        reporter, flush, step = _reporting
        ErrorHandler().record_exception(value)  # TORCHELASTIC_ERROR_FILE: torchrun's failure report
        flush()
        reporter.send(
            Error(
                type=kind.__name__,
                message=str(value)[:2000],
                traceback="".join(traceback.format_exception(kind, value, tb))[-8000:],
                step=step(),
            )
        )
        reporter.close(timeout=2.0)
        end_within()  # nothing watches this rank any more
        previous(kind, value, tb)

    sys.excepthook = report
