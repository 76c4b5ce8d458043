"""The shapes of what the GKE adapter writes and answers, as TypedDicts.

Kubernetes objects read from the API stay ``KubeObject`` (``Mapping[str, object]``): every field
is read through a checked accessor (objects.py), so a field of the wrong type reads as absent. What
Pitstop builds has a fixed shape, typed here: the check Jobs it creates (checks.py), the merge
patches it sends to Nodes, JobSets, batch Jobs and Kueue Workloads (``None`` removes a key, as
JSON merge patch does: RFC 7386), and the adapter's own answers (``GkeCluster``, whose every
fact a test or an operator may read). A body reaches the client as an argument of
``client.Kube.call``, which takes it as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NotRequired, TypedDict

from pitstop.core.scheduling import JobState

KubeObject = Mapping[str, object]  # a JSON object as the Kubernetes API returned it, read unchecked

# -- what Pitstop writes ------------------------------------------------------------------------


class MetaPatch(TypedDict, total=False):
    resourceVersion: str | None  # the read it was decided on (a 409 if the object changed since)
    labels: dict[str, str | None]
    annotations: dict[str, str | None]


class NodeSpecPatch(TypedDict, total=False):
    unschedulable: bool
    taints: list[KubeObject]  # the whole list: a merge patch replaces a list


class NodePatch(TypedDict, total=False):
    metadata: MetaPatch
    spec: NodeSpecPatch


class ActivePatch(TypedDict):
    active: bool


class WorkloadPatch(TypedDict, total=False):
    """A Kueue Workload deactivated (Kueue evicts the job) or reactivated (it is requeued)."""

    metadata: MetaPatch
    spec: ActivePatch


class SuspendSpec(TypedDict):
    suspend: bool
    # the whole list (a merge patch replaces a list), its pod templates with Pitstop's topology
    # nodeSelector: only in the update that suspends a JobSet (pin.py)
    replicatedJobs: NotRequired[list[KubeObject]]


class SuspendPatch(TypedDict, total=False):
    """A JobSet's or batch Job's ``spec.suspend`` and Pitstop's stop marks (gang.py)."""

    metadata: MetaPatch
    spec: SuspendSpec


class Taint(TypedDict):
    key: str
    value: str
    effect: str


class Toleration(TypedDict):
    key: str
    operator: str
    effect: str


class EnvVar(TypedDict):
    name: str
    value: str


class SecurityContext(TypedDict):
    privileged: bool
    allowPrivilegeEscalation: bool
    capabilities: dict[str, list[str]]
    seccompProfile: dict[str, str]


class Resources(TypedDict):
    limits: dict[str, str]
    requests: dict[str, str]


class Container(TypedDict):
    name: str
    image: str
    command: list[str]
    env: list[EnvVar]
    securityContext: SecurityContext
    resources: NotRequired[Resources]


class PodSpec(TypedDict, total=False):
    restartPolicy: str
    hostname: str
    subdomain: str
    automountServiceAccountToken: bool
    terminationGracePeriodSeconds: int
    tolerations: list[Toleration]
    initContainers: list[Container]
    containers: list[Container]
    nodeName: str
    nodeSelector: dict[str, str]


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]


class PodTemplate(TypedDict):
    metadata: ObjectMeta
    spec: PodSpec


class JobSpec(TypedDict):
    backoffLimit: int
    parallelism: int
    completions: int
    activeDeadlineSeconds: int
    ttlSecondsAfterFinished: int
    template: PodTemplate


class JobBody(TypedDict):
    """A check's batch/v1 Job (checks.py)."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: JobSpec


# -- what the adapter answers (GkeCluster) --------------------------------------------------------


class NodeAnswer(TypedDict, total=False):
    """A fence's or unfence's answer (fence.py); ``state: absent`` when the Node does not exist."""

    node: str
    state: str
    previous_state: str
    previous_reason: str | None
    already_drained_by_other: bool
    reason: str | None
    resumed: bool
    left_drained: str


class JobAnswer(TypedDict):
    """A job now (kinds.py): ``state`` as the contract's JobState (objects.py maps Kubernetes' words),
    ``restarts`` for JobSets only."""

    id: str
    job: str
    kind: str
    namespace: str
    name: str
    state: JobState
    restarts: int | None
    start_time: str | None
    workload: str | None
    failure_policy: NotRequired[bool]
    nodes: NotRequired[list[str]]  # a JobSet's: where its live pods run
    opted_in: NotRequired[bool]  # its owner's label pitstop.dev/heartbeat: "true" (hang remediation)
    pods_on_node: NotRequired[list[str]]  # jobs_on: its pods on the node asked about


class RequeueAnswer(TypedDict, total=False):
    """How a gang was restarted once (``restarted``: this call restarted it), or why nothing was done
    (``owner_action``); ``outcome`` says it in words, for people."""

    job: str
    restarted: bool
    outcome: str
    owner_action: str
    evicted: str | list[str]  # the pod evicted to restart a JobSet; the pods evicted from the node
    restarts: int
    attempt: int
    workload: str
    forced: list[str]  # pods force-deleted while Kueue stopped the job (``pod@node``)
    native: str  # the restart was left to the scheduler's own mechanism (kueue-tas)
    pinned: str  # the topology nodeSelector the gang was restarted under (pin.py), ``k=v,k=v``


class CapacityAnswer(TypedDict):
    enough: bool
    need: int | None
    free: int | None
    why: str
    nodes: NotRequired[list[str]]  # the gang: its live pods' nodes and the fenced one
    spares: NotRequired[list[str]]  # nodes a pod of it fits on besides the gang's, by name
    labels: NotRequired[dict[str, dict[str, str]]]  # node -> its topology labels (gce-topology-*)
    native: NotRequired[str | None]  # kueue-tas: Kueue replaces the failed node in its domain
    unusable: NotRequired[list[str]]  # the gang's other nodes out of service (fenced, NotReady, gone)
    places: NotRequired[bool]  # Pitstop can put the restarted gang in a domain (pin.py); else Kueue


class CheckStarted(TypedDict):
    started: str
    peer: str | None
    note: str


class CheckReport(TypedDict, total=False):
    """A check run's state; once done, each tool's stdout, stderr and exit code."""

    done: bool
    outputs: dict[str, str]
    stderr: dict[str, str]
    exit_codes: dict[str, int]
    peer: str | None
    error: str | None
    state: str | None  # the pod's phase
    note: str | None


class GangStarted(TypedDict, total=False):
    started: str
    nodes: list[str]
    stopped: bool
    note: str
    forced: list[str]


class GangResumed(TypedDict):
    job: str
    outcome: str
    resumed: bool
