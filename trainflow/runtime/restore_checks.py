"""What a verified checkpoint's own files must look like before a restore trusts them.

The manifest vouches for bytes, not for meaning: a hash-consistent checkpoint can still hold a
`.metadata` that points DCP at files outside the checkpoint, or JSON state of the wrong shape.
Each check returns the problems it found (empty: fine), each naming its file, so that every rank
can gather them and the restore moves on to the next candidate on all ranks together.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from trainflow.checkpoint.dcp_io import files_outside, load_metadata
from trainflow.runtime.state import TENSOR_REF

METADATA = ".metadata"
RNG_KEYS = ("python", "numpy", "torch", "cuda")


def metadata_problems(folder: Path, manifest_files: set[str]) -> list[str]:
    """DCP's `.metadata` may only name files the manifest lists."""
    try:
        metadata = load_metadata(folder / METADATA)
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        return [f"{METADATA}: not readable ({type(exc).__name__}: {str(exc)[:200]})"]
    outside = files_outside(metadata, manifest_files - {METADATA})
    return [f"{METADATA}: names files outside the manifest ({', '.join(outside[:5])})"] if outside else []


def _read_json(path: Path) -> tuple[Any, list[str]]:
    try:
        return json.loads(path.read_text()), []
    except FileNotFoundError:
        return None, [f"{path.name}: missing"]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, [f"{path.name}: not JSON ({str(exc)[:200]})"]


def read_shared(path: Path) -> tuple[dict | None, list[str]]:
    """`state.json`: the model's and optimizer's non-tensor state, with references to the tensors."""
    shared, problems = _read_json(path)
    if problems:
        return None, problems
    if not isinstance(shared, dict) or not all(isinstance(shared.get(k), dict) for k in ("model", "optim")):
        return None, [f"{path.name}: not an object with 'model' and 'optim' objects"]
    if any(not isinstance(ref, str) for ref in tensor_refs(shared)):
        return None, [f"{path.name}: a tensor reference that is not a name"]
    return shared, []


def read_personal(path: Path, step: int) -> tuple[dict | None, list[str]]:
    """`rank-N.json`: one rank's step, RNG states and extras."""
    personal, problems = _read_json(path)
    if problems:
        return None, problems
    if not isinstance(personal, dict):
        return None, [f"{path.name}: not a JSON object"]
    if personal.get("step") != step:
        return None, [f"{path.name}: step {personal.get('step')!r} is not the checkpoint's step {step}"]
    if not isinstance(personal.get("extras"), dict):
        return None, [f"{path.name}: 'extras' is not an object"]
    problem = _rng_problem(personal.get("rng"))
    if problem:
        return None, [f"{path.name}: RNG state {problem}"]
    return personal, []


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _rng_problem(rng: Any) -> str | None:
    """What is wrong with the shape `capture_rng` writes, or None."""
    if not isinstance(rng, dict) or any(key not in rng for key in RNG_KEYS):
        return f"lacks one of {', '.join(RNG_KEYS)}"
    python, numpy = rng["python"], rng["numpy"]
    if not (
        isinstance(python, list)
        and len(python) == 3
        and isinstance(python[0], int)
        and _ints(python[1])
        and (python[2] is None or isinstance(python[2], (int, float)))
    ):
        return "'python' is not [version, [ints], gauss]"
    if not (
        isinstance(numpy, list)
        and len(numpy) == 5
        and isinstance(numpy[0], str)
        and _ints(numpy[1])
        and _ints(numpy[2:4])
        and isinstance(numpy[4], (int, float))
    ):
        return "'numpy' is not [name, [ints], pos, has_gauss, cached]"
    if not _ints(rng["torch"]) or not all(0 <= v < 256 for v in rng["torch"]):
        return "'torch' is not a list of bytes"
    if not isinstance(rng["cuda"], list) or not all(_ints(s) for s in rng["cuda"]):
        return "'cuda' is not a list of byte lists"
    return None


def tensor_refs(tree: Any) -> list[Any]:
    """The tensor names a state tree refers to, in order."""
    refs: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if TENSOR_REF in node and len(node) == 1:
                refs.append(node[TENSOR_REF])
            else:
                for value in node.values():
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(tree)
    return refs
