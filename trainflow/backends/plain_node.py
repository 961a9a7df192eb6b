"""On each node, in torchrun's agent before it starts the script: the attempt's environment
variables, a plain script's own checkpoint folder restored from the store with its resume
arguments appended; while the script runs, node 0 (where rank 0 saves) copies that folder to the
checkpoint store whenever it is at rest (trainflow/checkpoint/plain_copies.py), and once more when
every rank has exited 0. The bytes go from the node that wrote them; the orchestrator verifies
each copy, records it and applies retention.

Every rank of every attempt gets, in both workload modes:
- TRAINFLOW_ATTEMPT: the attempt's number, from 1
- TRAINFLOW_RESUMING: "1" when the attempt resumes (plain: a copy was restored into the folder;
  runtime: the orchestrator chose a checkpoint for `run.restore`), else "0"
- TRAINFLOW_RESTORED_DIR (plain): the folder the copy was restored into, else ""
- TRAINFLOW_RESTORED_FROM (plain): the copy restored, as its URI, else ""
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from trainflow.backends.rank_records import RECORDS_ENV, read_exits
from trainflow.checkpoint.manifest import ManifestError
from trainflow.checkpoint.plain_copies import (
    QUIET_SCANS,
    SCAN_S,
    CopyIdentity,
    FolderState,
    Restored,
    folder_state,
    record_restore,
    restore_newest,
    script_folder,
    take_copy,
)
from trainflow.checkpoint.storage import Storage, StorageError, open_storage
from trainflow.contracts.exit_codes import STORE_UNREACHABLE
from trainflow.worker_config import CONFIG_ENV, WorkerConfig

ATTEMPT_ENV = "TRAINFLOW_ATTEMPT"
RESUMING_ENV = "TRAINFLOW_RESUMING"
RESTORED_DIR_ENV = "TRAINFLOW_RESTORED_DIR"
RESTORED_FROM_ENV = "TRAINFLOW_RESTORED_FROM"
RETRY_FAILED_COPY_S = 5.0


def say(message: str) -> None:
    print(f"trainflow: {message}", file=sys.stderr, flush=True)


def prepare_node(argv: list[str]) -> CopyWatch | None:
    """Set the attempt's variables, restore the script's folder and extend `argv` (torchrun's,
    the script's arguments last) with the resume arguments; the copy watch of node 0, started."""
    if not os.environ.get(CONFIG_ENV):
        return None  # torchrun run by hand
    config = WorkerConfig.from_env()
    os.environ[ATTEMPT_ENV] = str(config.attempt)
    os.environ[RESUMING_ENV] = "1" if config.restore_prefix else "0"
    if not config.plain_checkpoint_dir:
        return None
    folder = script_folder(config.plain_checkpoint_dir)
    storage = open_storage(config.checkpoint_uri)
    restored = Restored()
    if config.restore_prefix:
        try:
            restored = restore_newest(storage, config.restore_prefix, folder)
            record_restore(storage, config.run_id, config.attempt, config.node, restored)
        except (StorageError, OSError) as exc:
            say(f"cannot restore {storage.uri}/{config.restore_prefix} into {folder}: {exc}")
            os._exit(STORE_UNREACHABLE)
        for rejected in restored.rejected:
            say(f"copy {storage.uri}/{rejected['prefix']} passed over: {rejected['reason']}")
    resuming = restored.prefix is not None
    os.environ[RESUMING_ENV] = "1" if resuming else "0"
    os.environ[RESTORED_DIR_ENV] = str(folder) if resuming else ""
    os.environ[RESTORED_FROM_ENV] = f"{storage.uri}/{restored.prefix}" if resuming else ""
    if resuming:
        argv.extend(config.plain_resume_args)
        say(
            f"restored {storage.uri}/{restored.prefix} into {folder}; the script resumes with "
            f"{' '.join(config.plain_resume_args) or 'no extra arguments'}"
        )
    elif config.restore_prefix:
        say(f"no copy of {config.plain_checkpoint_dir} verified: the script starts from scratch")
    if config.node != 0:
        return None
    identity = CopyIdentity(config.run_id, config.world_size, config.spec_hash, config.code_version)
    watch = CopyWatch(
        folder,
        storage,
        identity,
        Path(config.node_scratch) / f"plain-copy-{config.attempt}",
        os.environ.get(RECORDS_ENV),
    )
    watch.start()
    return watch


class CopyWatch:
    """Node 0's copies of the script's folder: whenever it has been at rest for QUIET_SCANS scans
    and differs from the last copy, while no rank of the node has failed."""

    def __init__(self, folder: Path, storage: Storage, identity: CopyIdentity, aside: Path, records: str | None):
        self.folder, self.storage, self.identity, self.aside = folder, storage, identity, aside
        self._records = Path(records) if records else None
        self.copied: FolderState = folder_state(folder)  # what was there before the script ran is not its work
        self._failed_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainflow-plain-copies", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self, exit_code: int) -> None:
        """The script's ranks are gone: a last copy if every one exited 0, else none (a rank that
        died may have left a file half written)."""
        self._stop.set()
        self._thread.join()
        if exit_code == 0:
            state = folder_state(self.folder)
            for _ in range(3):
                if not state or state == self.copied or self._copy(state):
                    return

    def _run(self) -> None:
        previous: FolderState | None = None
        quiet = 0
        while not self._stop.wait(SCAN_S):
            state = folder_state(self.folder)
            quiet = quiet + 1 if state == previous else 1
            previous = state
            if quiet < QUIET_SCANS or not state or state == self.copied or self._rank_failed():
                continue
            if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_FAILED_COPY_S:
                continue
            self._copy(state)

    def _rank_failed(self) -> bool:
        return self._records is not None and any(code != 0 for code in read_exits(self._records).values())

    def _copy(self, state: FolderState) -> bool:
        started = time.perf_counter()
        try:
            committed = take_copy(self.folder, state, self.storage, self.identity, self.aside)
        except (StorageError, ManifestError, OSError) as exc:
            self._failed_at = time.monotonic()
            say(f"copy of {self.folder} to {self.storage.uri} failed (tried again when the folder is at rest): {exc}")
            return False
        if committed is None:
            return False  # it changed while copied: the script is writing
        self.copied, self._failed_at = state, None
        say(
            f"copied {self.folder} to {self.storage.uri}/{committed.prefix} ({committed.manifest.total_bytes} bytes, "
            f"{time.perf_counter() - started:.2f}s)"
        )
        return True
