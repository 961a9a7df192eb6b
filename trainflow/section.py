"""The base of every spec section (unknown keys refused, numbers taken as numbers only), and of a
backend's own section. A leaf: backend config modules import it without importing the spec."""

from __future__ import annotations

import math
import types
import typing
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

INT64_MAX = 2**63 - 1


def _number_type(annotation: Any) -> type | None:
    """int or float when a field holds that number (optionally None), else None."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = {_number_type(arg) for arg in typing.get_args(annotation) if arg is not type(None)}
        return kinds.pop() if len(kinds) == 1 else None
    if typing.get_origin(annotation) is Annotated:
        return _number_type(typing.get_args(annotation)[0])
    return annotation if annotation in (int, float) else None


def _shown(value: Any) -> str:
    """A value as the spec's YAML spells it."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def strict_number(value: Any, kind: type) -> Any:
    """A number field takes a number of its kind, nothing that merely converts to one."""
    if value is None:
        return value
    if kind is int:
        if type(value) is not int:
            raise ValueError(f"must be a whole number, not {_shown(value)}")
        if abs(value) > INT64_MAX:
            raise ValueError(f"{value} is out of range")
        return value
    if type(value) not in (int, float):
        raise ValueError(f"must be a number, not {_shown(value)}")
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, not {value!r}")
    return value


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # pydantic's lax mode reads `true` as 1, "inf" as infinity and 2.0 as 2; a spec means what it
    # says, so every number field of every section (also ones added later) takes numbers only
    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        kind = _number_type(field.annotation) if field else None
        return strict_number(value, kind) if kind else value


class BackendConfig(Section):
    """A backend's own spec section; each backend subclasses it in its own package.

    `backend` (a Literal of the backend's name) is the discriminator the spec's union is keyed by;
    the user never writes it: `resources.backend` chooses. `location` is where the user writes
    the section's fields: a top-level key of its own, or "resources" (the fields sit among those).
    """

    location: ClassVar[str]
    # why the backend needs checkpoint.uri to be a remote store, where it does (the spec checks it)
    remote_checkpoints_because: ClassVar[str | None] = None
    backend: str

    def check(self) -> None:
        """Checks made only when this is the chosen backend's section (another backend's section is
        never more than its defaults); raise ValueError naming the field."""

    def for_node_loss(self) -> Self:
        """This config as a node-loss drill needs it: every node can be cut off the network alone
        (unchanged where that needs no setting)."""
        return self
