"""A failed pod's log, read back into the failed ranks and their last words: torchrun's report as
the node agent writes it into the pod's log, and the rank's own lines before it."""

from __future__ import annotations

from trainflow.backends.kubernetes.evidence import pod_evidence
from trainflow.orchestrator.failures import exception_line

REPORT = """trainflow: the script's workers failed; torchrun's report:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_06:59:38
  host      : run-a1-0.run
  rank      : {rank} (local_rank: 0)
  exitcode  : 1 (pid: 25)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
RANK_OUTPUT = """trainflow: copied /scratch/out to s3://bucket/run/step-00000001 (2189 bytes, 0.03s)
[I1207 06:59:37.000000 25 ProcessGroupGloo.cpp:1] gloo chatter
Traceback (most recent call last):
  File "/app/train.py", line 9, in <module>
    raise ValueError("the batch is empty")
ValueError: the batch is empty
E1207 06:59:38.404000 1 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0
"""
# what the agent says on its way out when the peer hosting the rendezvous store left first
AGENT_SHUTDOWN = """[W1207 06:59:38.048282117 TCPStore.cpp:115] [c10d] recvVector failed: Failed to recv
W1207 06:59:38.701000 1 torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1298] The node 'run-a1-1' \
has failed to shutdown the rendezvous 'run-1' due to an error of type RendezvousConnectionError.
"""


def test_a_pod_of_one_rank_gives_that_rank_and_its_exception(tmp_path):
    log = tmp_path / "node-1.log"
    log.write_text(RANK_OUTPUT + REPORT.format(rank=3))
    evidence = pod_evidence(log, ranks_per_pod=1)
    [rank] = evidence["ranks"]
    assert (rank.rank, rank.local_rank, rank.exitcode, rank.root_cause) == (3, 0, 1, True)
    assert exception_line(rank.stderr_tail) == "ValueError: the batch is empty"
    assert not any("FAILED" in line or "gloo chatter" in line for line in rank.stderr_tail)
    assert evidence["worker_returncode"] == 1 and evidence["log_tail"] == ()


def test_a_pod_of_one_rank_leaves_its_agents_shutdown_out_of_the_ranks_words(tmp_path):
    log = tmp_path / "node-1.log"
    log.write_text(RANK_OUTPUT + AGENT_SHUTDOWN + REPORT.format(rank=1))
    [rank] = pod_evidence(log, ranks_per_pod=1)["ranks"]
    assert rank.stderr_tail[-1] == "ValueError: the batch is empty"
    assert not any("rendezvous" in line or "exitcode" in line for line in rank.stderr_tail)


def test_a_pod_of_several_ranks_names_the_rank_but_quotes_no_line_of_a_mixed_log(tmp_path):
    log = tmp_path / "node-0.log"
    log.write_text(RANK_OUTPUT + REPORT.format(rank=1))
    [rank] = pod_evidence(log, ranks_per_pod=2)["ranks"]
    assert rank.rank == 1 and rank.stderr_tail == ()


def test_a_pod_that_failed_before_any_rank_keeps_its_last_lines(tmp_path):
    log = tmp_path / "node-0.log"
    said = "torch.distributed.DistStoreError: Timed out after 900 seconds waiting for clients"
    log.write_text(said + "\n")
    evidence = pod_evidence(log, ranks_per_pod=1)
    assert evidence["ranks"] == () and evidence["worker_returncode"] is None
    assert evidence["log_tail"] == (said,)
