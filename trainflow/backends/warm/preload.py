"""What a zygote imports before it forks anyone: what every agent and rank needs, the script's own
top-level imports of installed packages, and the modules the spec names (`workload.preload`).

Only the script's leading block of imports counts, and its own local modules (next to it, or in
the working directory) are left out: they are the user's code, and may read the rank's
environment when they are imported. torch itself is always imported ahead: an environment
variable torch reads at import must reach the workers from outside the script."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

AGENT_MODULES = (
    "torch",
    "torch.distributed",
    "torch.distributed.run",
    "trainflow.backends.agent",
    "trainflow.relay.relay",
    "trainflow.backends.quick_rendezvous",
    "trainflow.backends.warm.torchrun_hook",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
)
# Not torch._dynamo, though DDP's constructor imports it (0.8 s of each rank's start): ranks forked
# from a process that imported it deadlock at exit far more often in torch 2.13's gloo race
# (docs/warm-workers.md: 15 of 200 forks, against 0 of 200 that import it themselves)
RANK_MODULES = ("torch.nn.parallel",)
RUNTIME_MODULES = ("trainflow.runtime", "torch.distributed.checkpoint", "torch.distributed.fsdp", "torch.nn.parallel")


def modules_to_preload(entrypoint: str, extra: list[str], uses_runtime: bool, cwd: Path) -> list[str]:
    names = list(AGENT_MODULES) + list(RANK_MODULES)
    if uses_runtime:
        names += RUNTIME_MODULES
    names += [name for name in script_imports(Path(entrypoint)) if _installed(name, Path(entrypoint), cwd)]
    names += extra
    return list(dict.fromkeys(names))


def script_imports(script: Path) -> list[str]:
    """The modules a script imports in its leading block of imports (also inside if/try blocks
    there), in order. The first other statement ends it: what follows may depend on it, as an
    import can on an environment variable the script sets first."""
    try:
        tree = ast.parse(script.read_text(), filename=str(script))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    names: list[str] = []
    _leading_imports(tree.body, names)
    return names


def _leading_imports(body: list[ast.stmt], names: list[str]) -> bool:
    """Collect the imports of `body` up to its first other statement; False once one was met."""
    for node in body:
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module != "__future__":
                names.append(node.module)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue  # a docstring
        elif isinstance(node, ast.If):
            if not (_leading_imports(node.body, names) and _leading_imports(node.orelse, names)):
                return False
        elif isinstance(node, ast.Try):
            if not _leading_imports(node.body, names):
                return False
        else:
            return False
    return True


def _installed(name: str, script: Path, cwd: Path) -> bool:
    """A module this interpreter finds that is not a file or folder beside the script or in the
    working directory (where `python script.py` would find the user's own modules first)."""
    top = name.partition(".")[0]
    if not top or top.startswith("__"):
        return False
    for folder in (script.resolve().parent, cwd.resolve()):
        if (folder / f"{top}.py").exists() or (folder / top).is_dir():
            return False
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False
