"""trainflow.orchestrator.failures: classifying an ended attempt and deciding whether to retry."""

from __future__ import annotations

import pytest

from trainflow.backends.base import NodeExit, RankExit
from trainflow.orchestrator.failures import (
    AttemptResult,
    Outcome,
    PlainWindow,
    classify_exit,
    decide,
    exception_line,
)
from trainflow.orchestrator.status import AttemptStatus
from trainflow.runspec import FaultTolerance
from trainflow.runtime.reporter import EXIT_ORCHESTRATOR_LOST


def policy(max_restarts: int = 3, **overrides) -> FaultTolerance:
    return FaultTolerance(max_restarts=max_restarts, **overrides)


def result(attempt: int, outcome: Outcome, last_step: int = 10, reason: str = "why") -> AttemptResult:
    return AttemptResult(
        attempt=attempt,
        outcome=outcome,
        reason=reason,
        world_size=2,
        started_at=0.0,
        ended_at=1.0,
        detected_at=1.0,
        failed_at=None,
        last_step=last_step,
        resumed_from_step=0,
    )


# --- decide ----------------------------------------------------------------------------------------


def test_success_is_not_retried():
    decision = decide(policy(3), [result(1, Outcome.SUCCEEDED, reason="finished at step 100")])
    assert decision.retry is False
    assert decision.reason == "finished at step 100"


@pytest.mark.parametrize("outcome", [Outcome.USER_ERROR, Outcome.CANCELLED])
def test_non_retryable_outcomes_stop(outcome):
    decision = decide(policy(3), [result(1, outcome)])
    assert decision.retry is False
    assert "not retried" in decision.reason


@pytest.mark.parametrize(
    "outcome", [Outcome.CRASHED, Outcome.KILLED, Outcome.HUNG, Outcome.NODE_LOST, Outcome.DIVERGED]
)
def test_retryable_outcome_with_budget_is_retried(outcome):
    decision = decide(policy(3), [result(1, outcome)])
    assert decision.retry is True
    assert "restart retry 1 of 3" in decision.reason


def test_preemptions_and_infra_failures_have_their_own_budgets():
    assert "preemption retry 1 of 10" in decide(policy(0), [result(1, Outcome.PREEMPTED)]).reason
    assert decide(policy(0, max_infra_failures=1), [result(1, Outcome.INFRA)]).retry is True
    spent = decide(policy(5, max_infra_failures=1), [result(1, Outcome.INFRA, 5), result(2, Outcome.INFRA, 9)])
    assert spent.retry is False and "infrastructure budget spent" in spent.reason


def test_user_errors_are_retried_only_when_asked():
    assert decide(policy(3), [result(1, Outcome.USER_ERROR)]).retry is False
    retry_all = policy(3, max_user_errors=1, retry_on=["USER_ERROR", "CRASHED"])
    assert decide(retry_all, [result(1, Outcome.USER_ERROR)]).retry is True


def test_outcome_left_out_of_retry_on_is_not_retried():
    decision = decide(policy(3, retry_on=["CRASHED"]), [result(1, Outcome.HUNG)])
    assert decision.retry is False and "HUNG is not retried" in decision.reason


def test_backoff_doubles_and_skips_preemptions():
    rules = policy(5, backoff_s=2.0, backoff_max_s=3.0)
    assert decide(rules, [result(1, Outcome.CRASHED, 1)]).backoff_s == 0.0  # an isolated failure: at once
    assert decide(rules, [result(1, Outcome.CRASHED, 1), result(2, Outcome.HUNG, 2)]).backoff_s == 2.0
    three = [result(1, Outcome.CRASHED, 1), result(2, Outcome.HUNG, 2), result(3, Outcome.KILLED, 3)]
    assert decide(rules, three).backoff_s == 3.0  # capped
    assert decide(rules, [result(1, Outcome.PREEMPTED)]).backoff_s == 0.0


def test_repeated_preemption_at_one_step_is_not_a_crash_loop():
    results = [result(1, Outcome.PREEMPTED, 40), result(2, Outcome.PREEMPTED, 40)]
    assert decide(policy(0), results).retry is True


def test_budget_spent_stops():
    results = [result(1, Outcome.CRASHED, 10), result(2, Outcome.CRASHED, 20), result(3, Outcome.CRASHED, 30)]
    decision = decide(policy(2), results)
    assert decision.retry is False
    assert "budget" in decision.reason


def test_last_restart_within_budget_is_taken():
    results = [result(1, Outcome.CRASHED, 10), result(2, Outcome.CRASHED, 20)]
    decision = decide(policy(2), results)
    assert decision.retry is True and "restart retry 2 of 2" in decision.reason


def test_no_restarts_allowed():
    decision = decide(policy(0), [result(1, Outcome.CRASHED)])
    assert decision.retry is False and "budget" in decision.reason


def test_crash_loop_stops_even_with_budget():
    results = [result(1, Outcome.CRASHED, 40), result(2, Outcome.CRASHED, 40)]
    decision = decide(policy(10), results)
    assert decision.retry is False
    assert "crash loop" in decision.reason


def test_same_step_but_different_outcome_is_not_a_crash_loop():
    results = [result(1, Outcome.NODE_LOST, 40), result(2, Outcome.CRASHED, 40)]
    assert decide(policy(10), results).retry is True


def test_same_outcome_with_progress_is_not_a_crash_loop():
    results = [result(1, Outcome.CRASHED, 40), result(2, Outcome.CRASHED, 60)]
    assert decide(policy(10), results).retry is True


# --- classify_exit ----------------------------------------------------------------------------------


def status(
    finished: dict | None = None,
    errors: list[dict] | None = None,
    stepped: bool = True,
    finished_ranks: set[int] | None = None,
) -> AttemptStatus:
    return AttemptStatus(
        attempt=1,
        finished=finished,
        errors=errors or [],
        first_step_at=1.0 if stepped else None,
        finished_ranks=finished_ranks or set(),
    )


def test_all_zero_and_finished_is_success():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, 0)], status(finished={"step": 200}))
    assert outcome == Outcome.SUCCEEDED
    assert "200" in reason


def test_a_sigterm_after_every_rank_finished_is_still_a_success():
    # a preemption or the time limit landing between the last commit and the agents' exit
    finished = status(finished={"step": 60}, finished_ranks={0, 1})
    outcome, reason = classify_exit([NodeExit(0, 128 + 15), NodeExit(1, -15)], finished, world_size=2)
    assert outcome == Outcome.SUCCEEDED
    assert "finished at step 60" in reason and "SIGTERM" in reason and "0, 1" in reason


@pytest.mark.parametrize(
    "exits, finished_ranks",
    [
        ([NodeExit(0, 128 + 15), NodeExit(1, 1)], {0, 1}),  # a node that failed on its own
        ([NodeExit(0, 128 + 15, ranks=(RankExit(1, 0, 1, root_cause=True),))], {0, 1}),  # a rank that did
        ([NodeExit(0, 128 + 15), NodeExit(1, 0)], {0}),  # a rank that never finished
    ],
)
def test_a_sigterm_is_no_success_unless_every_rank_finished_and_none_failed(exits, finished_ranks):
    outcome, _ = classify_exit(exits, status(finished={"step": 60}, finished_ranks=finished_ranks), world_size=2)
    assert outcome != Outcome.SUCCEEDED


def test_all_zero_without_finish_is_a_user_error():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, 0)], status())
    assert outcome == Outcome.USER_ERROR
    assert "finish" in reason


def test_user_exception_names_the_rank():
    error = {"rank": 3, "type": "ValueError", "step": 17, "message": "bad shape"}
    outcome, reason = classify_exit([NodeExit(0, 1), NodeExit(1, 0)], status(errors=[error]))
    assert outcome == Outcome.USER_ERROR
    assert "rank 3" in reason and "ValueError" in reason and "bad shape" in reason


def test_storage_error_is_infra():
    error = {"rank": 0, "type": "StorageError", "step": 5, "message": "s3 down"}
    outcome, _ = classify_exit([NodeExit(0, 1)], status(errors=[error]))
    assert outcome == Outcome.INFRA


def test_killed_by_signal():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, -9)], status())
    assert outcome == Outcome.KILLED
    assert "SIGKILL" in reason and "node 1" in reason


def test_orchestrator_lost_is_infra():
    outcome, reason = classify_exit([NodeExit(0, EXIT_ORCHESTRATOR_LOST)], status())
    assert EXIT_ORCHESTRATOR_LOST == 75
    assert outcome == Outcome.INFRA
    assert "orchestrator" in reason


def test_nonzero_exit_after_training_started_is_a_crash():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, 2)], status())
    assert outcome == Outcome.CRASHED
    assert "node 1" in reason and "code 2" in reason


def test_running_nodes_do_not_count_as_failed():
    outcome, _ = classify_exit([NodeExit(0, None), NodeExit(1, 0)], status(finished={"step": 5}))
    assert outcome == Outcome.SUCCEEDED


def test_other_signals_are_crashes_naming_the_signal():
    outcome, reason = classify_exit([NodeExit(0, -35)], status())
    assert outcome == Outcome.CRASHED and "signal 35" in reason
    outcome, reason = classify_exit([NodeExit(0, -11)], status())
    assert outcome == Outcome.CRASHED and "SIGSEGV" in reason


def test_the_failed_workers_own_code_wins_over_its_agents():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, 1, worker_returncode=-9)], status())
    assert outcome == Outcome.KILLED and "SIGKILL" in reason


def test_root_cause_exitcode_is_read_from_torchruns_failure_report(tmp_path):
    from trainflow.backends.torchrun_report import root_cause_exitcode

    log = tmp_path / "node-1.log"
    log.write_text(
        "Failures:\n  <NO_OTHER_FAILURES>\nRoot Cause (first observed failure):\n[0]:\n"
        "  rank      : 1 (local_rank: 0)\n  exitcode  : -9 (pid: 4242)\n  traceback : Signal 9 (SIGKILL)\n"
    )
    assert root_cause_exitcode(log) == -9
    assert root_cause_exitcode(tmp_path / "missing.log") is None


def test_the_retry_policy_names_failures_only():
    assert Outcome.SUCCEEDED not in FaultTolerance().retry_on and Outcome.CRASHED in FaultTolerance().retry_on
    with pytest.raises(ValueError, match="retry_on lists SUCCEEDED, which is not a failure"):
        FaultTolerance(retry_on=["CRASHED", "SUCCEEDED"])


# --- per rank: the first rank to fail is the cause ---------------------------------------------------

PEER = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer [127.0.0.1]:41234"


def test_a_segfault_whose_node_mate_reports_a_peer_error_is_a_crash_of_that_rank():
    # 2 nodes x 2 processes: rank 3 dies of SIGSEGV; its node-mate rank 2 and node 0's ranks only
    # report that a peer went away, and each agent stops what is left of its node
    errors = [
        {"rank": 2, "node": 1, "type": "DistBackendError", "step": 72, "message": PEER, "t": 100.2},
        {"rank": 0, "node": 0, "type": "DistBackendError", "step": 72, "message": PEER, "t": 100.3},
    ]
    exits = [
        NodeExit(
            0, 1, ranks=(RankExit(0, 0, 1, observed_at=100.0, root_cause=True), RankExit(1, 1, -15, observed_at=100.0))
        ),
        NodeExit(
            1, 1, ranks=(RankExit(3, 1, -11, observed_at=100.0, root_cause=True), RankExit(2, 0, 1, observed_at=100.0))
        ),
    ]
    outcome, reason = classify_exit(exits, status(errors=errors), world_size=4)
    assert outcome == Outcome.CRASHED
    assert "rank 3 on node 1" in reason and "SIGSEGV" in reason


def test_a_rank_killed_by_its_own_agent_is_not_the_cause():
    exits = [
        NodeExit(
            0, 1, ranks=(RankExit(1, 1, -15, observed_at=5.0), RankExit(0, 0, 3, observed_at=5.0, root_cause=True))
        )
    ]
    outcome, reason = classify_exit(exits, status(), world_size=2)
    assert outcome == Outcome.CRASHED and "rank 0" in reason and "code 3" in reason


def test_only_peer_errors_are_a_communication_failure():
    errors = [{"rank": 0, "node": 0, "type": "DistBackendError", "step": 9, "message": PEER, "t": 1.0}]
    exits = [NodeExit(0, 1, ranks=(RankExit(0, 0, 1, observed_at=1.0, root_cause=True),))]
    outcome, reason = classify_exit(exits, status(errors=errors), world_size=2)
    assert outcome == Outcome.INFRA and "Connection reset by peer" in reason


def test_a_plain_scripts_error_is_the_cause_though_its_peer_exited_first_quoting_the_lost_connection():
    # no runtime error reports: only the ranks' exits and stderr; rank 0 noticed rank 1's end first
    exits = [
        NodeExit(
            0,
            1,
            ranks=(
                RankExit(0, 0, 1, observed_at=20.0, root_cause=True, stderr_tail=(f"[rank0]: RuntimeError: {PEER}",)),
            ),
        ),
        NodeExit(
            1,
            1,
            ranks=(
                RankExit(
                    1,
                    0,
                    1,
                    observed_at=21.0,
                    root_cause=True,
                    stderr_tail=("RuntimeError: the data folder /data/shard-1 is empty",),
                ),
            ),
        ),
    ]
    outcome, reason = classify_exit(exits, status(), world_size=2, plain=True)
    assert outcome == Outcome.USER_ERROR
    assert "rank 1 on node 1" in reason and "the data folder /data/shard-1 is empty" in reason
    only_the_echo = [exits[0]]
    _, reason = classify_exit(only_the_echo, status(), world_size=2, plain=True)
    assert "rank 0 on node 0" in reason and "Connection reset by peer" in reason  # nothing else to go by


def test_an_exception_reported_before_a_signal_death_is_the_cause():
    errors = [{"rank": 1, "node": 1, "type": "ValueError", "step": 4, "message": "bad batch", "t": 50.5}]
    exits = [
        NodeExit(0, 1, ranks=(RankExit(0, 0, -11, observed_at=52.0, root_cause=True),)),
        NodeExit(1, 1, ranks=(RankExit(1, 0, 1, observed_at=51.0, root_cause=True),)),
    ]
    outcome, reason = classify_exit(exits, status(errors=errors), world_size=2)
    assert outcome == Outcome.USER_ERROR and "bad batch" in reason


# --- a script error at start-up ----------------------------------------------------------------------

ARGPARSE_TAIL = (
    "usage: train.py [-h] [--lr LR] [--hidden HIDDEN]",
    "train.py: error: argument --hidden: invalid int value: 'notanumber'",
)


def test_a_nonzero_exit_before_the_first_step_is_a_user_error_quoting_stderr():
    exits = [
        NodeExit(0, 2, ranks=(RankExit(0, 0, 2, observed_at=3.0, root_cause=True, stderr_tail=ARGPARSE_TAIL),)),
        NodeExit(1, 2, ranks=(RankExit(1, 0, 2, observed_at=3.0, root_cause=True, stderr_tail=ARGPARSE_TAIL),)),
    ]
    outcome, reason = classify_exit(exits, status(stepped=False), world_size=2)
    assert outcome == Outcome.USER_ERROR
    assert "before its first step" in reason
    assert "argument --hidden: invalid int value: 'notanumber'" in reason
    assert decide(policy(3), [result(1, outcome, 0, reason)]).retry is False  # not retried by default


def test_a_signal_before_the_first_step_is_still_a_crash():
    exits = [NodeExit(0, 1, ranks=(RankExit(0, 0, -11, observed_at=3.0, root_cause=True),))]
    assert classify_exit(exits, status(stepped=False), world_size=1)[0] == Outcome.CRASHED


# --- success needs every rank's finished report, and exit 0 ----------------------------------------


def test_success_needs_every_ranks_finished_report():
    exits = [NodeExit(0, 0), NodeExit(1, 0)]
    assert (
        classify_exit(exits, status(finished={"step": 9}, finished_ranks={0, 1}), world_size=2)[0] == Outcome.SUCCEEDED
    )
    outcome, reason = classify_exit(exits, status(finished={"step": 9}, finished_ranks={0}), world_size=2)
    assert outcome == Outcome.USER_ERROR and "without finishing" in reason


# --- plain torchrun scripts ----------------------------------------------------------------------------


def test_a_plain_script_succeeds_when_every_rank_exits_0():
    outcome, reason = classify_exit([NodeExit(0, 0), NodeExit(1, 0)], status(stepped=False), world_size=2, plain=True)
    assert outcome == Outcome.SUCCEEDED and "exited 0" in reason


def test_a_plain_script_that_raises_quotes_its_exception():
    tail = (
        "Traceback (most recent call last):",
        '  File "train.py", line 9, in <module>',
        "RuntimeError: the data folder /data/x is empty",
    )
    exits = [NodeExit(0, 1, ranks=(RankExit(1, 1, 1, observed_at=3.0, root_cause=True, stderr_tail=tail),))]
    outcome, reason = classify_exit(exits, status(stepped=False), world_size=2, plain=True)
    assert outcome == Outcome.USER_ERROR
    assert reason.endswith("RuntimeError: the data folder /data/x is empty")


# --- torchrun's own account, read back from its files --------------------------------------------------

TORCHRUN_REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
/tmp/seg.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_09:56:48
  host      : localhost
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 6802)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 6802
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_09:56:48
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : -11 (pid: 6803)  (SIGSEGV)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 6803
======================================================
"""


def test_every_failed_rank_is_read_from_torchruns_failure_report(tmp_path):
    from trainflow.backends.torchrun_report import failed_ranks

    log = tmp_path / "node-1.log"
    log.write_text("[default0]:training...\n" + TORCHRUN_REPORT)
    root, other = failed_ranks(log)
    assert (root.rank, root.local_rank, root.exitcode, root.root_cause) == (3, 1, -11, True)
    assert (other.rank, other.exitcode, other.root_cause) == (2, -15, False)
    assert root.observed_at is not None
    assert failed_ranks(tmp_path / "missing.log") == []


def test_a_ranks_stderr_tail_leaves_out_torchs_info_lines(tmp_path):
    from trainflow.backends.torchrun_report import stderr_tail

    (tmp_path / "rank-1.stderr").write_text(
        "usage: train.py [-h]\n[I1201 09:56:48.959 ProcessGroupGloo.cpp:760] Gloo connected\n"
        "[rank3]:[I1201 10:20:16.162133755 reducer.cpp:1228] Reducer: comm-optimized memory allocator not found\n"
        "train.py: error: argument --hidden: invalid int value: 'notanumber'\n\n"
    )
    assert stderr_tail(tmp_path, 1) == [
        "usage: train.py [-h]",
        "train.py: error: argument --hidden: invalid int value: 'notanumber'",
    ]
    assert stderr_tail(tmp_path, 0) == []


# --- plain scripts: the start-up window and the reason ------------------------------------------------

WARNED_THEN_DIED = (
    "/work/nanoGPT/train.py:196: FutureWarning: `torch.cuda.amp.GradScaler(args...)` is deprecated.",
    "  scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))",
)
TRACEBACK = (
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/work/train.py", line 12, in <module>',
    "[rank1]:     load()",
    "[rank1]: ValueError: ckpt.pt holds no 'model'",
    "[rank1]: (the message's second line)",
)


def test_the_reason_is_the_exception_line_never_a_warnings_source_line():
    assert exception_line(WARNED_THEN_DIED) == ""
    assert exception_line((*WARNED_THEN_DIED, *TRACEBACK)) == "ValueError: ckpt.pt holds no 'model'"
    assert (
        exception_line(("usage: train.py [-h]", "train.py: error: argument --lr: invalid float value: 'x'"))
        == "train.py: error: argument --lr: invalid float value: 'x'"
    )


def test_a_script_that_raised_nothing_is_not_blamed_on_its_last_log_line():
    said = ("iter 140: loss 2.31", "iter 150: loss 2.29")  # logging writes to stderr
    exits = [NodeExit(0, 1, ranks=(RankExit(0, 0, 1, observed_at=100.0, root_cause=True, stderr_tail=said),))]
    _, reason = classify_exit(exits, status(), world_size=2, plain=True, window=PlainWindow(90.0, 30.0))
    assert "exited with code 1" in reason and "loss" not in reason


def test_a_plain_exit_after_the_start_up_window_is_a_crash_and_within_it_the_users():
    exits = [
        NodeExit(0, 1, ranks=(RankExit(0, 0, 1, observed_at=100.0, root_cause=True, stderr_tail=(*WARNED_THEN_DIED,)),))
    ]
    outcome, reason = classify_exit(exits, status(), world_size=2, plain=True, window=PlainWindow(40.0, 30.0))
    assert outcome == Outcome.CRASHED and reason == "rank 0 on node 0 exited with code 1 60s after launch"
    outcome, reason = classify_exit(exits, status(), world_size=2, plain=True, window=PlainWindow(90.0, 30.0))
    assert outcome == Outcome.USER_ERROR and "plain_startup_window_s (30s)" in reason


def test_a_plain_rank_killed_by_a_signal_is_killed_naming_it():
    exits = [NodeExit(0, 1, ranks=(RankExit(1, 1, -9, observed_at=100.0, root_cause=True),))]
    outcome, reason = classify_exit(exits, status(), world_size=2, plain=True, window=PlainWindow(40.0, 30.0))
    assert outcome == Outcome.KILLED and "killed by SIGKILL" in reason


def test_the_exception_line_of_torchruns_error_file_when_stderr_has_none():
    exits = [
        NodeExit(
            0,
            1,
            ranks=(
                RankExit(
                    0,
                    0,
                    1,
                    observed_at=100.0,
                    root_cause=True,
                    stderr_tail=WARNED_THEN_DIED,
                    error_line="OSError: out/ckpt.pt: disk full",
                ),
            ),
        )
    ]
    _, reason = classify_exit(exits, status(), world_size=2, plain=True, window=PlainWindow(40.0, 30.0))
    assert reason.endswith(": OSError: out/ckpt.pt: disk full")


def test_a_plain_script_failing_twice_from_the_same_copy_is_a_crash_loop_but_not_from_a_newer_one():
    first, second, third = (result(n, Outcome.CRASHED, last_step=0) for n in (1, 2, 3))
    second.resumed_from, third.resumed_from = "s3://b/run/step-00000001", "s3://b/run/step-00000002"
    assert decide(policy(3), [first, second, third]).retry is True
    third.resumed_from = second.resumed_from
    assert "crash loop" in decide(policy(3), [first, second, third]).reason


def test_a_plain_node_stopped_by_sigterm_is_preempted_though_its_peer_failed_on_the_lost_connection():
    exits = [
        NodeExit(
            0,
            1,
            ranks=(
                RankExit(0, 0, 1, observed_at=20.0, root_cause=True, stderr_tail=(f"[rank0]: RuntimeError: {PEER}",)),
            ),
        ),
        NodeExit(1, 143),
    ]
    outcome, reason = classify_exit(exits, status(), world_size=2, plain=True, window=PlainWindow(0.0, 1.0))
    assert outcome == Outcome.PREEMPTED and reason == "node 1 stopped by SIGTERM (reclaimed)"
