"""Locating and loading the data files in schemas/ (policy as data, validated on load)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from pitstop.core.domain import JsonObject


class DataFileError(ValueError):
    """A data or policy file does not match its schema; the message names the offending path."""


def schema_dir() -> Path:
    """schemas/ beside the repo, or bundled into the package when staged for deployment."""
    env = os.environ.get("PITSTOP_SCHEMAS")
    candidates = [Path(env)] if env else []
    package = Path(__file__).resolve().parents[1]  # pitstop/: staged copies sit inside it
    candidates += [package / "schemas", package.parents[1] / "schemas"]
    for c in candidates:
        if (c / "fault_event.schema.json").is_file():
            return c
    raise FileNotFoundError(f"schemas/ not found (looked in {', '.join(map(str, candidates))})")


@functools.cache
def schema(name: str) -> JsonObject:
    """A JSON schema as jsonschema takes it (free-form: only jsonschema reads it)."""
    with open(schema_dir() / name, encoding="utf-8") as f:
        loaded: JsonObject = json.load(f)
    return loaded


@functools.cache
def validator(name: str) -> jsonschema.protocols.Validator:
    return validator_of(schema(name))


def validator_of(s: JsonObject) -> jsonschema.protocols.Validator:
    """A checked validator for a schema document (one composed in memory: core/plugins.py)."""
    cls = jsonschema.validators.validator_for(s)
    cls.check_schema(s)
    v: jsonschema.protocols.Validator = cls(s, format_checker=cls.FORMAT_CHECKER)
    return v


def validate(
    doc: Any, schema: str | jsonschema.protocols.Validator, what: str
) -> None:  # parsed YAML or JSON
    """Raise DataFileError naming the first offending path (e.g. ``rules/3/action``); ``schema``: a
    file of schemas/ or a validator."""
    v = validator(schema) if isinstance(schema, str) else schema
    errors = sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise DataFileError(f"{what}: {where}: {e.message}")


def load_yaml(path: Path, schema_name: str) -> JsonObject:
    """The file, checked against its schema; free-form still: each caller casts it to the TypedDict
    of its schema (core/policy_types.py)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        raise DataFileError(f"{path}: not valid YAML: {exc}") from exc
    validate(doc, schema_name, str(path))
    assert isinstance(doc, dict)
    return doc
