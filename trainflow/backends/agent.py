"""torchrun's agent, leaving as soon as it is done: `python -m trainflow.backends.agent ARGS` runs
torchrun's own main with ARGS, then exits with its status.

torchrun tees each rank's output (`--tee`) from threads of a pool. On the path a SIGTERM takes (the
kernel's parent-death signal when the orchestrator dies) those threads are never told to stop, and
the interpreter would wait for them at exit forever: an agent that outlives its run. Exiting with
os._exit once torchrun has returned or raised skips that wait; what torchrun writes (its error
file, its logs) is written before. Stopped by a signal (torchrun's SignalException, once it has
ended its workers), the agent exits 128 + the signal's number, as a shell reports it: the
orchestrator tells a node that was stopped from one that failed.

The agent also runs its node's status relay (trainflow/relay/): its ranks report to it, and it sends
one stream for the node to the orchestrator; it is closed (its last report sent) before the agent
exits.

Before torchrun starts the script, the agent sets the attempt's environment and restores a plain
script's own checkpoint folder; node 0's agent copies that folder to the checkpoint store while the
script runs (plain_node.py). Before it exits, no worker is left running under it
(leftover_workers.py). Each rank runs its script through script_main.py, which keeps a
`sys.exit("why")` message where torchrun's failure report reads it.

With in-process restart, the agent makes the node's shared-memory folder for its ranks' in-memory
copies (shared_copies.py, removed as it exits), and a rank process that dies is replaced in place
rather than ending the node (rank_replacement.py)."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainflow.worker_config import WorkerConfig


def make_node_scratch() -> WorkerConfig | None:
    """The node's private scratch folder (its relay's socket, a plain script's copies aside, the
    node-local checkpoint tier), before anything is put in it; returns the attempt's configuration,
    None for torchrun run by hand."""
    from trainflow.worker_config import CONFIG_ENV, WorkerConfig

    if not os.environ.get(CONFIG_ENV):
        return None
    config = WorkerConfig.from_env()
    config.make_node_scratch()
    return config


def main() -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    from trainflow.backends import (
        bounded_output,
        quick_rendezvous,
        rank_records,
        rank_replacement,
        script_main,
        store_sockets,
    )
    from trainflow.backends.leftover_workers import end_leftover_workers
    from trainflow.backends.plain_node import prepare_node
    from trainflow.backends.shared_copies import make_for_node, remove
    from trainflow.relay.relay import start_for_node

    config = make_node_scratch()
    # with in-process restart, the ranks' in-memory copies outlive a rank's process (shared_copies.py)
    shared = make_for_node(Path(config.node_scratch), config.attempt) if config and config.in_place_budget else None
    copies = prepare_node(sys.argv)  # before the records' variable leaves the environment
    script_main.install()  # a rank that starts as a new interpreter runs its script as a warm one does
    quick_rendezvous.install_from_environment()
    store_sockets.install_from_environment()
    bounded_output.install_from_environment()
    rank_records.install_from_environment()
    if shared is not None:
        rank_replacement.install_from_environment(config.in_place_budget)

    code = 0
    relay = None
    try:
        relay = start_for_node()
        torchrun()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except ChildFailedError as exc:
        # torchrun's failure report, without the agent's own traceback in front of it: the lines
        # before the report are the ranks' (a pod's log is read from the cluster as it is)
        print(f"trainflow: the script's workers failed; torchrun's report:{exc}", file=sys.stderr)
        code = 1
    except SignalException as exc:
        print(f"trainflow: torchrun's agent stopped by {exc.sigval.name}", file=sys.stderr)
        code = 128 + int(exc.sigval)
    except BaseException:  # as an uncaught exception would end the interpreter: its traceback, exit 1
        traceback.print_exc()
        code = 1
    finally:
        killed = end_leftover_workers()
        if killed:
            print(
                f"trainflow: torchrun's agent killed {len(killed)} worker process(es) that outlived it: "
                f"{'; '.join(killed)}",
                file=sys.stderr,
            )
        if relay is not None:
            relay.close()
        remove(shared)
        if copies is not None:
            copies.finish(code)
        sys.stdout.flush()
        sys.stderr.flush()
        bounded_output.close_installed()  # what the ranks wrote last is in the node log before it ends
        os._exit(code)


if __name__ == "__main__":
    main()
