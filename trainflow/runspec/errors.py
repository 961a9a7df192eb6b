"""The error a spec that cannot run raises, and pydantic's errors as one line naming the fields."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError


class SpecError(ValueError):
    """A spec that cannot run; the message names the file or field and says what to do."""


def describe_validation_error(exc: ValidationError, user_path: Callable[[tuple], tuple] = tuple) -> str:
    """All problems on one line, each at its field as the user writes it (`user_path` maps pydantic's locations)."""
    problems = []
    for error in exc.errors():
        field = ".".join(str(p) for p in user_path(tuple(error["loc"])))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "missing":
            message = "required field is missing"
        problems.append(f"{field}: {message}" if field else message)
    return "; ".join(problems)
