"""Reading a spec: YAML file, `--set key.path=value` overrides, validation into a RunSpec."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from trainflow.runspec.backend_section import user_path
from trainflow.runspec.errors import SpecError, describe_validation_error
from trainflow.runspec.run import RunSpec


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: object, line: int):
        super().__init__(f"{key} (line {line})")
        self.key, self.line = key, line


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping: PyYAML keeps the last silently,
    so a spec would run with a value its author may not have meant."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                continue  # an unhashable key: the base loader says what is wrong with it
            if duplicate:
                raise DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(text: str) -> object:
    """Parse YAML safely; DuplicateKey names a key written twice in one mapping."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunSpec:
    """Read a spec file, apply `key.path=value` overrides and validate; SpecError names the problem."""
    path = Path(path)
    try:
        raw = read_yaml(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: spec file not found") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a directory; give the spec's YAML file") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file (a spec is YAML in UTF-8)") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc.strerror or exc}") from None
    except DuplicateKey as exc:
        raise SpecError(
            f"{path}: key {exc.key!r} is written twice in one mapping (line {exc.line}); keep one"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise SpecError(f"{path}: not valid YAML{where}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a spec is a YAML mapping with name, workload, resources, ...")
    for item in overrides:
        apply_override(raw, item)
    return parse_spec(raw, source=str(path))


def parse_spec(raw: dict[str, Any], source: str = "spec") -> RunSpec:
    try:
        return RunSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(f"{source}: {describe_validation_error(exc, user_path)}") from None


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `a.b.c=value` override; the value is read as YAML (so 20 is an int, [a, b] a list)."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise SpecError(f"--set {item!r}: expected key.path=value")
    *parents, leaf = key.split(".")
    node = raw
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise SpecError(f"--set {item!r}: {part} is not a section")
        node = child
    try:
        node[leaf] = read_yaml(text) if text else ""
    except DuplicateKey as exc:
        raise SpecError(f"--set {item!r}: key {exc.key!r} is written twice") from None
    except yaml.YAMLError:
        raise SpecError(f"--set {item!r}: value is not valid YAML") from None
