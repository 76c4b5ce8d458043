"""The shapes of deploy's data files: infra/resources.yaml's entries and infra/iam.yaml.

Both are plain dicts when loaded; deploy checks each against its schema (schemas/deploy-resources
and deploy-iam .schema.json) before it is one of these, so ``mypy --strict`` checks every key a
builder reads. deploy.yaml, a person's file, is not one of these: it stays ``Mapping[str, object]``
and deploy.load_config checks each key it reads.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pitstop.core.domain import JsonObject

# iam.yaml's roles on one resource each (the resource named under the key without ``_roles``)
ResourceRoles = Literal["topic_roles", "subscription_roles", "secret_roles", "function_roles"]
ScaleKey = Literal["concurrency", "cpu", "memory", "max_instances", "min_instances"]


class Scale(TypedDict, total=False):
    """A function's size as measured (deploy.scale_flags insists on every key)."""

    concurrency: int
    cpu: float
    memory: str
    max_instances: int
    min_instances: int


class IamCondition(TypedDict):
    title: str
    expression: str
    join: NotRequired[str]  # a deploy.yaml list: the expression once per entry, ORed (deploy._condition)


class ResourceEntry(TypedDict, total=False):
    """One entry of resources.yaml (a group of entries, a generator, or one resource of a ``kind``),
    or an entry a generator made from iam.yaml (``display``, ``condition``). Which keys a kind
    reads: its builder in deploy.KINDS."""

    kind: str
    what: str
    name: str
    # repetition and generation
    for_each: str  # a key of deploy.FOR_EACH
    if_config: str  # exists only when deploy.yaml sets this key
    generate: bool  # a secret: created with a random first value
    resources: list[ResourceEntry]
    expand: str  # a key of deploy.EXPAND
    plugins: str  # a slot: the plugin folders' entries for it are spliced in here (deploy._resources)
    role_what: str
    roles: list[ResourceRoles]  # account-roles: which of iam.yaml's resource-level roles
    agent: str  # agent-roles: an iam.yaml service agent
    ttls: dict[str, str]  # ttl: collection -> its TTL field
    files: str  # file: a glob under infra/
    # what the kinds read
    names: list[str]
    project: str
    file: str
    base: str  # gke-kustomize: a kustomize base directory under infra/
    topic: str
    flags: list[str]
    collections: list[str]
    subcollections: list[str]
    field: str
    collection_group: str
    constraint: str
    warn: str
    when: str
    cluster: str
    location: str
    filter: str
    filter_file: str  # a log sink's filter file (infra/filters)
    member: str
    role: str
    account: str
    channel: str
    function: str
    entry_point: str
    env: dict[str, str | int | float]  # numbers written as they print
    secrets: dict[str, str]  # env var -> secret
    secrets_if: dict[str, dict[str, str]]  # deploy.yaml key -> the secrets it adds
    scale: Scale
    source: str
    schedule: str
    uri: str
    # open: a log metric's LogMetric fields, written out for gcloud as they are (a filter_file folded in)
    config: JsonObject
    config_file: str
    # only in generated entries (deploy.EXPAND)
    display: str
    condition: IamCondition | None


class Grant(TypedDict, total=False):
    """One role an account holds: on the project, or on one resource named by its own key."""

    role: str
    condition: str  # a key of iam.yaml's conditions, or compute-zones / gke-node-vms
    why: str
    if_config: str
    topic: str
    subscription: str
    secret: str
    function: str
    account: str  # a service agent's grant: on which of Pitstop's accounts


class AccountSpec(TypedDict, total=False):
    """One of iam.yaml's service accounts (``cluster``: set on a per-cluster copy, deploy.expand_accounts)."""

    display: str
    cluster: str
    project_roles: list[Grant]
    compute_roles: list[Grant]
    gke_roles: list[Grant]
    topic_roles: list[Grant]
    subscription_roles: list[Grant]
    secret_roles: list[Grant]
    function_roles: list[Grant]


class ServiceAgent(TypedDict, total=False):
    member: str  # with {project_number}
    why: str
    account_roles: list[Grant]


class IamDoc(TypedDict):
    service_accounts: dict[str, AccountSpec]
    conditions: dict[str, IamCondition]
    service_agents: dict[str, ServiceAgent]
