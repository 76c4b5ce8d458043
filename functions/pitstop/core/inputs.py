"""The threat model as data: every input Pitstop reads (schemas/inputs.yaml), typed.

Who can write each input, what it may cause alone, and the evidence that gates each disruptive
action it can lead to. Read by the doctor (core/writers.py, tools/exposure.py), the security
table (tools/security_table.py) and tests/test_inputs.py, which fails when the code reads an
input this file does not list.
"""

from __future__ import annotations

import functools
from typing import NotRequired, TypedDict, cast

from pitstop.core import resources

INPUTS_FILE, INPUTS_SCHEMA = "inputs.yaml", "inputs.schema.json"
ALONE = ("record", "page", "fence")  # the most a hint or evidence may cause by itself, in order
CONTROL = "control"  # Pitstop's own channel between its parts: a foreign writer there acts as Pitstop


class Route(TypedDict):
    filter: str
    resource_type: str
    log_id: str


class Write(TypedDict):
    permission: str
    scope: str  # project | topic | cluster | node | google


class Gated(TypedDict):
    actions: list[str]
    gates: list[str]


class Input(TypedDict):
    id: str
    kind: str  # hint | evidence | control
    status: NotRequired[str]
    what: str
    routes: NotRequired[list[Route]]
    topics: NotRequired[list[str]]
    policy_files: NotRequired[list[str]]
    metric_types: NotRequired[list[str]]
    node_conditions: NotRequired[list[str]]
    slurm_commands: NotRequired[list[str]]
    entry_point: NotRequired[str]
    read_by: list[str]
    writes: list[Write]
    writer_note: NotRequired[str]
    alone: str
    leads_to: list[Gated]


class Model(TypedDict):
    permissions: dict[str, str]
    gates: dict[str, str]
    actions: list[str]
    inputs: list[Input]
    adapters: dict[str, list[str]]


@functools.cache
def model() -> Model:
    """schemas/inputs.yaml, checked against its schema."""
    doc = resources.load_yaml(resources.schema_dir() / INPUTS_FILE, INPUTS_SCHEMA)
    return cast(Model, doc)  # validated: the schema is the TypedDict's


def topics_of(inp: Input, clusters: list[str]) -> list[str]:
    """The input's topics, a ``{cluster}`` one once per Slurm cluster."""
    out: list[str] = []
    for t in inp.get("topics", []):
        out += [t.format(cluster=c) for c in clusters] if "{cluster}" in t else [t]
    return out
