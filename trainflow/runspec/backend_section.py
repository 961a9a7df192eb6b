"""`RunSpec.backend_config`: the chosen backend's own section, a union of the registered backends'
config models keyed by the backend's name.

A user writes it where it always was (`slurm:`, `kubernetes:`, or local's `network` among
`resources:`) and `resources.backend` chooses; these functions translate between that shape and
the typed field, in validation, in dumps (so recorded specs and spec hashes are unchanged) and in
the JSON schema (so Prefect's form shows the sections the user writes, another backend's folded away).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import Discriminator, Tag, ValidationError

from trainflow.backends.catalog import backend_configs
from trainflow.section import BackendConfig

FIELD = "backend_config"


def _backend_of(value: Any) -> str | None:
    return value.get("backend") if isinstance(value, dict) else getattr(value, "backend", None)


# a callable discriminator: pydantic refuses a Literal one on models whose every field has a
# before-validator (Section's numbers-are-numbers check)
if TYPE_CHECKING:  # the union is built from the registry at run time; its members are BackendConfigs
    BackendConfigs = BackendConfig
else:
    BackendConfigs = Annotated[
        Union[tuple(Annotated[config, Tag(name)] for name, config in backend_configs().items())],  # noqa: UP007
        Discriminator(_backend_of),
    ]


def _owns_section(config: type[BackendConfig], spec_fields: Iterable[str]) -> bool:
    """Whether the config has a top-level section of its own, rather than keys among another's."""
    return config.location not in spec_fields


def chosen_backend(resources: Any, default: str) -> str:
    if isinstance(resources, dict):
        name = resources.get("backend", default)
    else:
        name = getattr(resources, "backend", None) or default
    name = name.value if isinstance(name, Enum) else name
    if name not in backend_configs():
        raise ValueError(f"resources.backend: {name!r} is not a backend; choose one of {', '.join(backend_configs())}")
    return name


def from_user_shape(raw: Any, spec_fields: Iterable[str], default_backend: str) -> Any:
    """The spec as written, with the chosen backend's section moved into `backend_config`; another
    backend's section is refused unless it only repeats that backend's defaults (recorded specs and
    Prefect's form carry every section)."""
    if not isinstance(raw, dict) or FIELD in raw:
        return raw
    raw = dict(raw)
    spec_fields = list(spec_fields)
    chosen = chosen_backend(raw.get("resources"), default_backend)
    for name, config in backend_configs().items():
        values, where = _take(raw, config, spec_fields)
        if name == chosen:
            raw[FIELD] = {**values, "backend": name}
        elif values and not _is_default(config, values):
            raise ValueError(
                f"{where}: only read with resources.backend: {name}, and this spec's backend is {chosen} "
                f"(remove {where} or set resources.backend: {name})"
            )
    return raw


def _take(raw: dict, config: type[BackendConfig], spec_fields: list[str]) -> tuple[dict, str]:
    """Remove the config's keys from the raw spec: its values and where the user wrote them."""
    if _owns_section(config, spec_fields):
        values = raw.pop(config.location, None)
        if values is None:
            return {}, config.location
        if not isinstance(values, dict):
            raise ValueError(f"{config.location}: must be a section (a mapping of settings)")
        return values, config.location
    section = raw.get(config.location)
    if not isinstance(section, dict):
        return {}, config.location
    section = dict(section)
    values = {key: section.pop(key) for key in list(section) if key in config.model_fields and key != "backend"}
    raw[config.location] = section
    return values, f"{config.location}.{next(iter(values), '')}".rstrip(".")


def _is_default(config: type[BackendConfig], values: dict) -> bool:
    try:
        return config.model_validate(values).model_dump() == config.model_validate({}).model_dump()
    except ValidationError:
        return False


def to_user_shape(dumped: dict, mode: str, by_alias: bool | None, spec_fields: Iterable[str]) -> dict:
    """A dump of the spec with `backend_config` written back where the user writes it, and every
    other backend's section at its defaults: the spec's recorded form (and hash) as before."""
    if FIELD not in dumped:  # a partial dump (include/exclude)
        return dumped
    chosen = dumped.pop(FIELD)
    spec_fields = list(spec_fields)
    for name, config in backend_configs().items():
        if chosen.get("backend") == name:
            values = {key: value for key, value in chosen.items() if key != "backend"}
        else:
            values = config.model_validate({}).model_dump(mode=mode, by_alias=bool(by_alias), exclude={"backend"})
        if _owns_section(config, spec_fields):
            dumped[config.location] = values
        elif isinstance(dumped.get(config.location), dict):
            dumped[config.location].update(values)
    return dumped


def user_shaped_schema(schema: dict, resolve: Any, spec_fields: Iterable[str]) -> None:
    """Rewrite the spec's JSON schema (in place) to the shape a user writes."""
    properties = schema.get("properties", {})
    if FIELD not in properties:
        return
    union = properties.pop(FIELD)
    schema["required"] = [name for name in schema.get("required", []) if name != FIELD]
    refs = [choice["$ref"] for choice in union["oneOf"]]  # in the union's order: the catalog's
    spec_fields = list(spec_fields)
    for ref, (name, config) in zip(refs, backend_configs().items(), strict=True):
        member = resolve({"$ref": ref})
        member["properties"].pop("backend", None)
        member["required"] = [key for key in member.get("required", []) if key != "backend"]
        if _owns_section(config, spec_fields):
            properties[config.location] = _collapsed_section(name, ref, member)
        else:
            resolve(properties[config.location])["properties"].update(member["properties"])


def _collapsed_section(name: str, ref: str, member: dict) -> dict:
    """A backend's own section as an optional one: Prefect's form shows a choice between its
    defaults (a section left out, null) and its fields, and starts at the defaults, so a form for
    another backend's run stays short. The form's label is the backend's name."""
    member["title"] = "Settings"
    return {
        "title": name.capitalize(),
        "description": member.get("description", ""),
        "anyOf": [{"type": "null", "title": "Defaults"}, {"$ref": ref}],
        "default": None,
    }


def user_path(loc: tuple) -> tuple:
    """An error's location as the user wrote it: (backend_config, slurm, x) is slurm.x."""
    if len(loc) < 2 or loc[0] != FIELD or loc[1] not in backend_configs():
        return loc
    return (backend_configs()[loc[1]].location, *loc[2:])
