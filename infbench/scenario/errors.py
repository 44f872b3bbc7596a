"""One pydantic validation error -> one line naming the dotted key, what is wrong and what is
allowed, e.g. `workload.batch_size: must be > 0 (got -1)`."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Union

from pydantic import BaseModel

from infbench.scenario.values import MAX_VALUE, short_repr

_BOUNDS = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
           "less_than": ("<", "lt"), "less_than_equal": ("<=", "le")}
_TYPES = {
    "int_parsing": "an integer", "int_type": "an integer", "int_from_float": "an integer",
    "float_parsing": "a number", "float_type": "a number", "finite_number": "a finite number",
    "bool_parsing": "true or false",
    "bool_type": "true or false", "string_type": "a string", "model_type": "a mapping of keys",
    "dict_type": "a mapping", "list_type": "a list", "tuple_type": "a list",
    "model_attributes_type": "a mapping of keys",
}


def format_error(err: Any, raw: Any, root: type[BaseModel],
                 sweep_keys: Sequence[str] = ()) -> str:
    """`dotted.key: what is wrong (got X)` for one error of validating `raw` against `root`;
    a key the `sweep:` block set reads `sweep.dotted.key`."""
    parts: list[str] = []
    node = raw
    for part in err["loc"]:
        if isinstance(part, int):
            if isinstance(node, list):  # a real list index; a scalar wrapped as a list has none
                parts[-1] += f"[{part}]"
                node = node[part] if part < len(node) else None
            continue
        parts.append(str(part))
        node = node.get(part) if isinstance(node, dict) else None
    key = ".".join(parts)
    if any(key == k or key.startswith(k + ".") for k in sweep_keys):
        key = "sweep." + key
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(root, [p for p in err["loc"] if isinstance(p, str)][:-1])
        hint = difflib.get_close_matches(parts[-1], allowed, n=1)
        mean = f" (did you mean {hint[0]}?)" if hint else ""
        msg = f"unknown key{mean}; allowed: {', '.join(allowed)}"
    elif kind == "missing":
        msg = "required key is missing"
    elif kind == "literal_error":
        allowed = [a.strip("'") for a in str(ctx.get("expected", "")).replace(" or ", ", ")
                   .split(", ")]
        msg = f"unknown value {short_repr(got)}; allowed: {', '.join(allowed)}"
    elif kind in _BOUNDS:
        op, bound = _BOUNDS[kind]
        limit = ctx.get(bound)
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        sane = " (2**24, infbench's sanity limit)" if limit == MAX_VALUE else ""
        msg = f"must be {op} {limit}{sane} (got {short_repr(got)})"
    elif kind in _TYPES:
        msg = f"must be {_TYPES[kind]} (got {short_repr(got)})"
    elif kind == "too_short":
        msg = "needs at least one value"
    elif kind in ("value_error", "assertion_error"):
        msg = str(ctx.get("error", err["msg"]))
    else:
        msg = f"{err['msg'][:1].lower()}{err['msg'][1:]} (got {short_repr(got)})"
    return f"{key}: {msg}" if key else msg


def _allowed_keys(root: type[BaseModel], loc: list[str]) -> list[str]:
    cls: Any = root
    for part in loc:
        fields = cls.model_fields
        if part not in fields:
            return []
        cls = _model_class(fields[part].annotation)
        if cls is None:
            return []
    return sorted(cls.model_fields)


def _model_class(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (Union, types.UnionType, Annotated):
        for arg in typing.get_args(annotation):
            found = _model_class(arg)
            if found is not None:
                return found
    return None
