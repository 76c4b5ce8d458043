"""The plugin folders as data: which channels and schedulers exist, in which order, with which
configuration and deploy fragments (``functions/pitstop/plugins/<kind>/<name>/``).

A plugin is one folder, as a node-problem-detector problem daemon or a Cluster Toolkit module is:
its code (``__init__.py``), its manifest (``plugin.yaml``: order, the environment it reads, its
deploy fragment), its configuration schema fragments (``policy.schema.json``: a scheduler's block of
a policy cluster; ``deploy.schema.json``: the deploy.yaml keys it adds, with their defaults) and its
local sink or stand-in (``local.py``, never shipped). Adding one is adding a folder: the registries
(services/channels.py, services/schedulers.py), the policy loader, deploy and the local stack find
it here. This module only reads files; importing a plugin's code is the services' business.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import jsonschema

from pitstop.core import resources
from pitstop.core.domain import JsonObject

Kind = Literal["channels", "schedulers"]
KINDS: tuple[Kind, ...] = ("channels", "schedulers")
MANIFEST = "plugin.yaml"
POLICY_FRAGMENT = "policy.schema.json"
DEPLOY_FRAGMENT = "deploy.schema.json"


@dataclass(frozen=True)
class Plugin:
    """One plugin folder, its manifest checked against schemas/plugin.schema.json."""

    kind: Kind
    name: str
    order: int
    folder: Path
    manifest: JsonObject

    @property
    def module(self) -> str:
        """The folder's Python package (its code)."""
        return f"pitstop.plugins.{self.kind}.{self.name}"

    def fragment(self, file: str) -> JsonObject | None:
        """A schema fragment of the folder (None: it has none)."""
        path = self.folder / file
        if not path.is_file():
            return None
        loaded: JsonObject = json.loads(path.read_text(encoding="utf-8"))
        return loaded

    @property
    def deploy(self) -> JsonObject:
        """The manifest's deploy fragment (empty: nothing to deploy)."""
        found = self.manifest.get("deploy")
        return cast(JsonObject, found) if isinstance(found, dict) else {}


def plugins_dir() -> Path:
    """pitstop/plugins beside pitstop/core: in the repository and in the staged function source."""
    return Path(__file__).resolve().parents[1] / "plugins"


@functools.cache
def found(kind: Kind) -> tuple[Plugin, ...]:
    """Every plugin folder of a kind, by its manifest's ``order`` (then name)."""
    out = []
    for folder in sorted((plugins_dir() / kind).iterdir()):
        if not (folder / MANIFEST).is_file():
            continue
        doc = resources.load_yaml(folder / MANIFEST, "plugin.schema.json")
        if doc["name"] != folder.name or doc["kind"] != kind:
            raise resources.DataFileError(f"{folder / MANIFEST}: name and kind must be the folder's")
        out.append(Plugin(kind, folder.name, int(cast(int, doc["order"])), folder, doc))
    return tuple(sorted(out, key=lambda p: (p.order, p.name)))


def names(kind: Kind) -> list[str]:
    return [p.name for p in found(kind)]


def all_plugins() -> tuple[Plugin, ...]:
    """Channels, then schedulers: the order deploy lists their fragments in."""
    return tuple(p for kind in KINDS for p in found(kind))


@functools.cache
def policy_validator() -> jsonschema.protocols.Validator:
    """schemas/policy.schema.json with every scheduler folder's block (what policies are checked by)."""
    return resources.validator_of(policy_schema(resources.schema("policy.schema.json")))


def policy_schema(base: JsonObject) -> JsonObject:
    """The policy schema with each scheduler folder's cluster block: its name among ``scheduler``'s
    values, its ``policy.schema.json`` as the cluster's ``<name>`` property, and that block required
    where its manifest says ``policy_block: required``. ``#/$defs/...`` in a fragment names the
    policy schema's own definitions."""
    doc = copy.deepcopy(base)
    item = cast(JsonObject, cast(JsonObject, cast(JsonObject, doc["properties"])["clusters"])["items"])
    props = cast(JsonObject, item["properties"])
    scheduler = cast(JsonObject, props["scheduler"])
    enum = cast(list[object], scheduler["enum"])
    rules = cast(list[object], item.setdefault("allOf", []))
    nodeless = [p.name for p in found("schedulers") if p.manifest.get("nodes") is False]
    if nodeless:  # a cluster of VMs Pitstop cannot see (Vertex AI's) names no node to claim
        item["required"] = [r for r in cast(list[str], item["required"]) if r != "match"]
        rules.append(
            {"if": {"properties": {"scheduler": {"enum": nodeless}}}, "else": {"required": ["match"]}}
        )
    for p in found("schedulers"):
        enum.append(p.name)
        block = p.fragment(POLICY_FRAGMENT)
        if block is None:
            continue
        props[p.name] = block
        if p.manifest.get("policy_block") == "required":
            rules.append(
                {
                    "if": {"properties": {"scheduler": {"const": p.name}}, "required": ["scheduler"]},
                    "then": {"required": [p.name]},
                }
            )
    return doc


def deploy_schema() -> JsonObject:
    """deploy.yaml's keys that plugins add (each folder's ``deploy.schema.json`` properties)."""
    props: JsonObject = {}
    for p in all_plugins():
        frag = p.fragment(DEPLOY_FRAGMENT)
        if frag is not None:
            props.update(cast(JsonObject, frag.get("properties") or {}))
    return {"type": "object", "properties": props}


def deploy_defaults() -> JsonObject:
    """The defaults of those keys (what a deploy.yaml that does not name them means)."""
    props = cast(JsonObject, deploy_schema()["properties"])
    return {k: cast(JsonObject, v)["default"] for k, v in props.items() if "default" in cast(JsonObject, v)}
