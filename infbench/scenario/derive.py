"""A scenario section derived from a frozen config dataclass: one definition per concept.

The dataclass (core's `QuantConfig`, `EngineConfig`, `SpeculativeConfig`, ..., or the
scenario's own `WorkloadPoint`) names the keys, their defaults, their allowed values and their
meaning (its attribute docstrings); `section_from` turns it into the pydantic model that
validates the YAML, so the two cannot drift.  A core field's plain type becomes strict here
(int: a count in 1..2**24, float: a finite number > 0, bool: true or false), and a field
annotated `Annotated[str, SomeLiteral]` takes that Literal's values; `types` replaces the
type of a field whose range is narrower (`prune.mlp_fraction` in [0, 1)).  `ModelConfig`'s
`model.overrides` section is derived the same way (every field optional).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap
import types as pytypes
import typing
from collections.abc import Collection, Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, Field, create_model

from infbench.scenario.values import PosInt, Section, StrictBool

_NONE = type(None)


def attribute_docs(cls: type) -> dict[str, str]:
    """Field name -> the string literal right below its annotation in the class body (the
    attribute docstrings pydantic's `use_attribute_docstrings` reads from a model)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (a frozen interpreter): no descriptions
        return {}
    body = typing.cast(ast.ClassDef, ast.parse(source).body[0]).body
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def strict_hint(hint: Any) -> Any:
    """A config field's type as the scenario validates it (see the module docstring)."""
    if hint is int:
        return PosInt
    if hint is float:
        return Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]
    if hint is bool:
        return StrictBool
    if typing.get_origin(hint) is Annotated:
        base, *meta = typing.get_args(hint)
        literal = next((m for m in meta if typing.get_origin(m) is Literal), None)
        if base is str and literal is not None:
            return literal
        return hint
    if typing.get_origin(hint) in (Union, pytypes.UnionType):
        return Union[tuple(strict_hint(a) for a in typing.get_args(hint))]
    return hint


def _as_list(value: Any) -> Any:
    return value if isinstance(value, list) or value is None else [value]


def sweep_hint(hint: Any) -> Any:
    """`T` -> a non-empty list of T that also takes one T (`batch_size: 8` or `[1, 8]`);
    `T | None` -> the same or null."""
    args = typing.get_args(hint) if typing.get_origin(hint) in (Union, pytypes.UnionType) else ()
    # Types built at run time: mypy cannot check them (valid-type).
    if _NONE in args:
        one: Any = Union[tuple(a for a in args if a is not _NONE)]
        return Annotated[list[one] | None, Field(min_length=1),  # type: ignore[valid-type]
                         BeforeValidator(_as_list, json_schema_input_type=Union[
                             one, list[one], None])]  # type: ignore[valid-type]
    return Annotated[list[hint], Field(min_length=1),  # type: ignore[valid-type]
                     BeforeValidator(_as_list, json_schema_input_type=Union[
                         hint, list[hint]])]  # type: ignore[valid-type]


def section_from(cls: type, name: str, *, base: type[BaseModel] = Section,
                 exclude: Collection[str] = (), types: Mapping[str, Any] | None = None,
                 defaults: Mapping[str, Any] | None = None, optional: bool = False,
                 sweep: Collection[str] = (), docs: Mapping[str, str] | None = None,
                 doc: str | None = None, module: str | None = None) -> type[BaseModel]:
    """The pydantic section of dataclass `cls`: its fields (less `exclude`) in order, typed by
    `strict_hint` (or `types`), defaulting to the dataclass defaults (or `defaults`), described
    by its attribute docstrings (or `docs`).  `optional`: every field may be left unset (null
    default: `model.overrides`, `model.attention`); `sweep`: those fields take a list.
    `module`: where the section is defined (the caller's `__name__`)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    described = {**attribute_docs(cls), **(docs or {})}
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in exclude or not f.init:
            continue
        hint = (types or {}).get(f.name) or strict_hint(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = ...  # required
        if defaults and f.name in defaults:
            default = defaults[f.name]
        if optional:
            hint, default = Union[hint, None], None
        if f.name in sweep:
            hint, default = sweep_hint(hint), None if default is None else [default]
        fields[f.name] = (hint, Field(default, description=described.get(f.name)))
    return create_model(name, __base__=base, __module__=module or base.__module__,
                        __doc__=doc or cls.__doc__, **fields)
