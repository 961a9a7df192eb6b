"""Save and restore the training state with DCP, publish it to the checkpoint store, commit it.

Each rank stages its own DCP shard in node-local scratch, uploads it from where it was written,
and reports name, size and sha256; rank 0 then writes the manifest last, which is the commit.
Restore downloads a committed checkpoint, verifies every file against the manifest, and only
then loads it.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainflow.checkpoint.catalog import checkpoint_prefix, read_manifest
from trainflow.checkpoint.manifest import MANIFEST_NAME, Manifest, describe_file, verify_files
from trainflow.checkpoint.storage import Storage
from trainflow.runtime.state import capture_rng, join_tensors, restore_rng, split_tensors
from trainflow.worker_config import WorkerConfig

SHARED_STATE = "state.json"


class CheckpointInvalid(RuntimeError):
    """A checkpoint that does not match its manifest; it is never loaded."""


@dataclass(frozen=True)
class SaveResult:
    step: int
    prefix: str
    total_bytes: int
    stage_s: float
    save_s: float
    upload_s: float


@dataclass(frozen=True)
class Stateful:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    extras: dict[str, Any]


def rank_file(rank: int) -> str:
    return f"rank-{rank}.json"


class Checkpointer:
    def __init__(self, config: WorkerConfig, storage: Storage, rank: int, world_size: int):
        self.config = config
        self.storage = storage
        self.rank = rank
        self.world_size = world_size
        self.scratch = Path(config.node_scratch) / f"rank-{rank}"

    def save(self, step: int, state: Stateful) -> SaveResult | None:
        """Collective: every rank calls it. Returns the result on rank 0 once committed."""
        started = time.perf_counter()
        tensors, shared, personal = self._snapshot(step, state)
        staged = time.perf_counter()

        stage = self.scratch / "stage" / f"step-{step:08d}"
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(stage))
        (stage / rank_file(self.rank)).write_text(json.dumps(personal))
        if self.rank == 0:
            (stage / SHARED_STATE).write_text(json.dumps(shared))
        saved = time.perf_counter()

        prefix = checkpoint_prefix(self.config.run_id, step)
        entries = []
        for path in sorted(stage.iterdir()):
            entries.append(describe_file(path))
            self.storage.upload(path, f"{prefix}/{path.name}")
        shutil.rmtree(stage, ignore_errors=True)
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, entries)
        uploaded = time.perf_counter()

        if self.rank != 0:
            return None
        files = tuple(sorted((e for rank_entries in gathered for e in rank_entries), key=lambda e: e.name))
        manifest = Manifest(
            step=step,
            world_size=self.world_size,
            spec_hash=self.config.spec_hash,
            code_version=self.config.code_version,
            run_id=self.config.run_id,
            files=files,
        )
        self.storage.put_if_absent(f"{prefix}/{MANIFEST_NAME}", manifest.to_json().encode())
        return SaveResult(
            step=step,
            prefix=prefix,
            total_bytes=manifest.total_bytes,
            stage_s=staged - started,
            save_s=saved - staged,
            upload_s=uploaded - saved,
        )

    def restore(self, prefix: str, state: Stateful) -> int:
        """Load a committed checkpoint into the live objects; returns its step."""
        manifest = read_manifest(self.storage, prefix)
        folder = self.scratch / "restore" / Path(prefix).name
        shutil.rmtree(folder, ignore_errors=True)
        for entry in manifest.files:
            self.storage.download(f"{prefix}/{entry.name}", folder / entry.name)
        problems = verify_files(manifest, folder)
        if problems:
            raise CheckpointInvalid(f"{prefix}: " + "; ".join(problems))

        model_sd, optim_sd = self._state_dicts(state)
        template, _ = split_tensors({"model": model_sd, "optim": optim_sd})
        shared = json.loads((folder / SHARED_STATE).read_text())
        wanted = {key: template[key] for key in _tensor_refs(shared)}
        dcp.load(wanted, storage_reader=dcp.FileSystemReader(folder))
        restored = join_tensors(shared, wanted)
        if state.optimizer is not None:
            set_state_dict(
                state.model,
                state.optimizer,
                model_state_dict=restored["model"],
                optim_state_dict=restored["optim"],
            )
        else:
            set_state_dict(state.model, [], model_state_dict=restored["model"], optim_state_dict={})

        own = folder / rank_file(self.rank)
        personal = json.loads((own if own.exists() else folder / rank_file(0)).read_text())
        if own.exists():
            restore_rng(personal["rng"])
        for name, obj in state.extras.items():
            if name in personal["extras"]:
                obj.load_state_dict(personal["extras"][name])
        shutil.rmtree(folder, ignore_errors=True)
        return manifest.step

    def model_state(self, state: Stateful) -> dict[str, torch.Tensor]:
        return dict(self._state_dicts(state)[0])

    def _state_dicts(self, state: Stateful) -> tuple[dict, dict]:
        optimizers = [state.optimizer] if state.optimizer is not None else []
        return get_state_dict(state.model, optimizers)

    def _snapshot(self, step: int, state: Stateful) -> tuple[dict[str, torch.Tensor], Any, dict]:
        model_sd, optim_sd = self._state_dicts(state)
        tensors, shared = split_tensors({"model": model_sd, "optim": optim_sd})
        personal = {
            "step": step,
            "rng": capture_rng(),
            "extras": {name: obj.state_dict() for name, obj in state.extras.items()},
        }
        return tensors, shared, personal


def _tensor_refs(tree: Any) -> list[str]:
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "__tensor__" in node and len(node) == 1:
                refs.append(node["__tensor__"])
            else:
                for value in node.values():
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(tree)
    return refs
