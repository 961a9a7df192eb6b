"""What can be told of a training script by reading it, before anything runs: it compiles, and a
script run in `runtime` mode imports `trainflow.runtime` (itself, or through a module of its own
beside it).

Reading decides only what it can: a script that loads modules by name at run time (importlib,
__import__, runpy, exec), imports a module of its own that cannot be read, or imports a module
that is not installed here, or installed with a distribution that depends on trainflow, might
reach the runtime unseen, and is never refused for it."""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

RUNTIME = "trainflow.runtime"
DYNAMIC_LOADERS = {"importlib", "runpy", "__import__", "exec", "eval", "import_module", "run_path", "run_module"}


@dataclass(frozen=True)
class ScriptProblem:
    """Why a script cannot run as the spec says: one line for the person who wrote it."""

    line: str


def compile_problem(script: Path) -> ScriptProblem | None:
    """The script's own syntax error, with its file, line and message; None when it compiles."""
    try:
        source = script.read_bytes()
    except OSError as exc:
        return ScriptProblem(f"{script}: cannot be read ({exc.strerror})")
    try:
        compile(source, str(script), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{exc.filename or script}:{exc.lineno}" if exc.lineno else str(exc.filename or script)
        return ScriptProblem(f"{where}: {type(exc).__name__}: {exc.msg}")
    except ValueError as exc:  # null bytes
        return ScriptProblem(f"{script}: does not compile: {exc}")
    return None


def imports_runtime(script: Path) -> bool | None:
    """True when the script, or a module of its own it imports, imports trainflow.runtime; False
    when reading them shows it never does; None when reading cannot tell."""
    home = script.resolve().parent
    seen: set[Path] = set()
    pending = [script.resolve()]
    undecided = False
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        try:
            tree = ast.parse(path.read_bytes(), str(path))
        except (OSError, SyntaxError, ValueError):
            undecided = True  # a module of its own that cannot be read might import it
            continue
        found, dynamic, names = _imports(tree)
        if found:
            return True
        undecided = undecided or dynamic
        for name in names:
            local = _local_module(home, name)
            if local is not None:
                pending.append(local)
            elif not _known_elsewhere(name.split(".")[0]):
                undecided = True
    return None if undecided else False


def _imports(tree: ast.AST) -> tuple[bool, bool, list[str]]:
    """(imports the runtime, loads modules by name, the modules it imports by name)."""
    names: list[str] = []
    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_runtime(alias.name):
                    return True, dynamic, names
                names.append(alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and (
                _is_runtime(module) or (module == "trainflow" and any(a.name == "runtime" for a in node.names))
            ):
                return True, dynamic, names
            if node.level == 0:
                names.append(module)
                names.extend(f"{module}.{alias.name}" for alias in node.names)
            else:
                dynamic = True  # a relative import in a script: a package run another way
        elif isinstance(node, ast.Name) and node.id in DYNAMIC_LOADERS:
            dynamic = True
        elif isinstance(node, ast.Attribute) and node.attr in DYNAMIC_LOADERS:
            dynamic = True
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "runtime"
            and isinstance(node.value, ast.Name)
            and node.value.id == "trainflow"
        ):
            return True, dynamic, names
    return False, dynamic, names


def _is_runtime(module: str) -> bool:
    return module == RUNTIME or module.startswith(RUNTIME + ".")


def _local_module(home: Path, name: str) -> Path | None:
    """The file a script beside `home` imports as `name`, if it is one of its own."""
    parts = name.split(".")
    folder = home.joinpath(*parts)
    for candidate in (folder.with_suffix(".py"), folder / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None


def _known_elsewhere(top: str) -> bool:
    """An import that is not the script's own and cannot bring the runtime in: the standard
    library, trainflow's other modules, or an installed module of no distribution that depends on trainflow."""
    if top in sys.stdlib_module_names or top in ("trainflow", "__future__"):
        return True
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    if found is None:
        return False  # not installed here: the workers may find it on their own path
    return top not in _modules_depending_on_trainflow()


@cache
def _modules_depending_on_trainflow() -> frozenset[str]:
    """The top-level modules of installed distributions that require trainflow (usually none)."""
    tops: set[str] = set()
    for distribution in metadata.distributions():
        requires = distribution.requires or []
        if not any(r.lower().replace("_", "-").split(";")[0].strip().startswith("trainflow") for r in requires):
            continue
        listed = distribution.read_text("top_level.txt")
        if listed:
            tops.update(listed.split())
        for file in distribution.files or []:
            parts = file.parts
            if parts and not parts[0].endswith((".dist-info", ".egg-info")) and parts[0] != "..":
                tops.add(parts[0].removesuffix(".py"))
    return frozenset(tops)
