"""Reading a scenario: the YAML file, `--set KEY=VALUE` overrides, validation, and the load-time
checks of every point (presets, quantization), each failure one line naming the file."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from infbench.core.config import ModelConfig
from infbench.core.errors import DamagedFileError, UserError
from infbench.core.io import read_text
from infbench.scenario.document import Scenario, set_dotted, validate
from infbench.scenario.values import short_repr


def load_scenario(path: str | os.PathLike[str], sets: Sequence[str] = ()) -> Scenario:
    """Read, override (`--set key=value`), validate and expand-check one scenario file."""
    return scenario_from_document(read_document(path, sets), str(path))


def read_document(path: str | os.PathLike[str], sets: Sequence[str] = ()) -> dict[str, Any]:
    """One scenario file as its YAML mapping with the `--set` items applied, not validated
    (`infbench search` sets the searched key before validating each point)."""
    source = str(path)
    file = Path(path)
    if not file.exists():
        raise UserError(f"{source}: no such scenario file")
    if not file.is_file():
        raise UserError(f"{source}: not a file")
    data = _read_yaml(file, source)
    if not isinstance(data, dict):
        got = "an empty file" if data is None else type(data).__name__
        raise DamagedFileError(
            f"{source}: expected a mapping of keys at the top level (got {got})")
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise UserError(f"{source}: top-level key {short_repr(bad_keys[0])} is not a name; "
                        f"allowed: {', '.join(sorted(Scenario.model_fields))}")
    apply_sets(data, sets, source)
    return data


def scenario_from_document(data: dict[str, Any], source: str) -> Scenario:
    """Validate a scenario-shaped document (a file's, or one `predict` built from its flags).

    Presets and quantization are checked for every point here, at load time, not halfway
    through a sweep; checkpoint configs are read later, once per point, by the caller.
    """
    scenario = validate(data, source)
    for point in scenario.points():
        if point.model is not None and point.model.preset is not None:
            point.model_config()
        point.quant_config()
    return scenario


def apply_sets(data: dict[str, Any], sets: Sequence[str], source: str) -> None:
    """Apply `--set KEY=VALUE` items to a scenario document, in place.

    The one `--set` parser of every command: KEY is a dotted scenario key
    (`workload.batch_size`, `model.overrides.hidden_size`, `model.attention.kind`,
    `engine.block_size`, `sweep.workload.prompt_len`), VALUE is YAML (`8`, `mla`, `[1, 8]`,
    `null`).  The document is validated afterwards, by the caller, with the scenario schema.
    """
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. workload.batch_size=8")
        try:
            value = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)
        except (yaml.YAMLError, RecursionError):
            raise UserError(f"--set {item!r}: the value is not valid YAML") from None
        key = key.strip()
        head = key.split(".")[0]
        if head not in Scenario.model_fields and _old_form_hint(key):
            raise UserError(f"--set {item!r}: unknown key {head!r}{_old_form_hint(key)}")
        if key.startswith("sweep."):
            data.setdefault("sweep", {})
            if not isinstance(data["sweep"], dict):
                raise UserError(f"{source}: sweep: must be a mapping of dotted keys to lists")
            data["sweep"][key[len("sweep."):]] = value
        else:
            set_dotted(data, key, value, source, what="--set " + key)


def _old_form_hint(key: str) -> str:
    """`num_layers` -> ' (did you mean model.overrides.num_layers?)' for the old predict form."""
    head = key.split(".")[0]
    if head in ("attention", "quant"):
        return f" (did you mean model.{key}?)"
    if head in {f.name for f in dataclasses.fields(ModelConfig)}:
        return f" (did you mean model.overrides.{key}?)"
    return ""


def _read_yaml(file: Path, source: str) -> Any:
    """Parse one YAML file; every way it can fail is one DamagedFileError naming the file."""
    text = read_text(file, "scenario file", DamagedFileError)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        if "\t" in problem or "'\\t'" in problem:
            problem += " (YAML indents with spaces; replace the tab)"
        raise DamagedFileError(f"{source}{line}: invalid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        first = (str(exc).splitlines() or ["syntax error"])[0]
        raise DamagedFileError(f"{source}: invalid YAML: {first}") from exc
    except RecursionError as exc:
        raise DamagedFileError(f"{source}: invalid YAML: nested too deeply") from exc


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (PyYAML silently keeps the last one)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            hash(key)
        except TypeError:
            raise yaml.MarkedYAMLError(problem=f"a key must be a name, not {type(key).__name__}",
                                       problem_mark=key_node.start_mark) from None
        if key in seen:
            raise yaml.MarkedYAMLError(problem=f"duplicate key {key!r}",
                                       problem_mark=key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)
# YAML 1.2 reads `1e-9` and `2E3` as numbers; PyYAML (YAML 1.1) wants a dot (`1.0e-9`) and
# read `rate: 1e-9` as the string "1e-9", refused as not a number.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"))
