"""``components.schemas``: the protocol's schemas and the task's, in AsyncAPI's draft-07 dialect.

The envelope, report and cancel schemas are the shipped ones (``protocol.schemas``); the
task's input and output models' come from pydantic, under ``task.<Model>``. All are JSON
Schema 2020-12, rewritten by :func:`draft07` into the draft-07 that AsyncAPI reads.

Each schema's ``title`` is its name, unique in the document: code generators name their
types after it (Modelina does), and pydantic's titles are bare class names (a task's
``Output`` would meet the ``Output`` Modelina makes of the output channel's messages). The
protocol's schemas keep their names (``Envelope``, ``StartedReport``...), the task's take
``Task`` before theirs (``task.Output`` is titled ``TaskOutput``).
"""

from __future__ import annotations

from typing import Any, Final

from pydantic.errors import PydanticInvalidForJsonSchema
from pydantic.json_schema import models_json_schema

from async_task_api_worker.definition import TaskDefinition
from async_task_api_worker.errors import ConfigError
from async_task_api_worker.protocol.schemas import load_schema

__all__ = [
    "SCHEMAS",
    "TASK_SCHEMA_PREFIX",
    "TASK_TITLE_PREFIX",
    "component_schemas",
    "draft07",
    "summary",
]

#: Where ``components.schemas`` is, for references.
SCHEMAS: Final = "#/components/schemas/"
#: The prefix of the task's own schemas among ``components.schemas``: none of the protocol's
#: names has it, so a task model named ``Envelope`` or ``InputRef`` cannot clash.
TASK_SCHEMA_PREFIX: Final = "task."
#: The prefix of their titles; no title of the protocol's schemas starts with it either.
TASK_TITLE_PREFIX: Final = "Task"


def summary(schema: dict[str, Any]) -> str:
    """The first line of ``schema``'s description (a message's summary)."""
    return str(schema.get("description", "")).split("\n", 1)[0]


def component_schemas(task: TaskDefinition) -> tuple[dict[str, Any], str, str]:
    """``components.schemas``, and the references of the task's input and output schemas."""
    schemas: dict[str, Any] = {}
    envelope, report, cancel = (load_schema(name) for name in ("envelope", "report", "cancel"))
    for source in (envelope, report, cancel):
        schemas.update(source.pop("$defs", {}))
    # The report schema's root is only a oneOf of the four: each report is its own message.
    for source in (envelope, cancel):
        for key in ("$id", "$schema"):  # an $id would move the base that references resolve on
            source.pop(key, None)
    schemas["Envelope"], schemas["CancelRequest"] = envelope, cancel
    try:
        refs, top = models_json_schema(
            [(task.input_model, "validation"), (task.output_model, "serialization")],
            ref_template=f"{SCHEMAS}{TASK_SCHEMA_PREFIX}{{model}}",
        )
    except PydanticInvalidForJsonSchema as exc:
        first_line = str(exc).split("\n", 1)[0]
        raise ConfigError(
            f"the task's models ({task.input_model.__name__}, {task.output_model.__name__}) "
            f"have no JSON Schema: {first_line}"
        ) from exc
    for name, schema in schemas.items():
        schema["title"] = name
    for name, schema in top.get("$defs", {}).items():
        schemas[f"{TASK_SCHEMA_PREFIX}{name}"] = {**schema, "title": f"{TASK_TITLE_PREFIX}{name}"}
    converted = {name: draft07(schema) for name, schema in schemas.items()}
    return (
        converted,
        refs[(task.input_model, "validation")]["$ref"],
        refs[(task.output_model, "serialization")]["$ref"],
    )


# Keywords whose values are schemas: a map of them, a list of them, or one (or a list: items).
_SCHEMA_MAPS: Final = frozenset(
    {"properties", "patternProperties", "definitions", "$defs", "dependentSchemas"}
)
_SCHEMA_LISTS: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_ONES: Final = frozenset(
    {"items", "additionalItems", "additionalProperties", "not", "if", "then", "else"}
    | {"contains", "propertyNames", "unevaluatedItems", "unevaluatedProperties"}
)


def draft07(schema: Any) -> Any:
    """``schema`` (JSON Schema 2020-12) in AsyncAPI's draft-07 dialect, references moved.

    A ``const`` that is not a string becomes the one-value ``enum`` it equals: Modelina 5.10
    makes a constant of a string ``const`` only, and of any other leaves the property out of
    its constructor and of ``unmarshal``, so that ``marshal`` drops it (``protocol_version``).
    A ``discriminator`` is left out.

    Only keywords are rewritten, never values (a ``default`` or an ``example`` that happens to
    hold a ``$ref`` key stays as it is): the walk follows the keywords that hold schemas.
    """
    if not isinstance(schema, dict):
        return schema  # true / false
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
            out[key] = SCHEMAS + value.removeprefix("#/$defs/")
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: draft07(item) for name, item in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [draft07(item) for item in value]
        elif key in _SCHEMA_ONES:
            out[key] = (
                [draft07(item) for item in value] if isinstance(value, list) else draft07(value)
            )
        elif key == "const" and not isinstance(value, str) and "enum" not in schema:
            out["enum"] = [value]
        elif key == "discriminator":
            # OpenAPI's object (pydantic's discriminated unions) is left out, as from the
            # protocol's schemas: each branch's const already decides. AsyncAPI's own (a
            # property name) would make Modelina 5.10 name an enum of each branch's tag after
            # the tag's title, alike in every branch: each overwrites the last, and the models
            # do not compile.
            continue
        else:
            out[key] = value
    if "prefixItems" in out:  # draft-07 writes a tuple as a list of items
        rest = out.pop("items", None)
        out["items"] = out.pop("prefixItems")
        if rest is not None:
            out["additionalItems"] = rest
    return out
