"""A recording, stateful stand-in for the Google REST APIs `pitstop deploy` drives through gcloud.

gcloud reaches it through ``CLOUDSDK_API_ENDPOINT_OVERRIDES_<API>=http://127.0.0.1:PORT/<api>/``,
so the first path segment names the API. Every request is recorded (method, path, verb,
query, JSON body) for tests to assert on; resources live in memory so a create is seen by
a later describe, a second create of the same name is a 409, and a describe of a missing
resource is a 404 in Google's error shape. The long-running operations of the APIs that
return them are born done, so gcloud's pollers finish at their first look.

Where Google does something on the caller's behalf the fake does too: a Logging sink gets
a writer identity, a Pub/Sub-triggered function (or an Eventarc trigger of its own) gets a push
subscription created on the Pub/Sub emulator, a function gets a Cloud Run service and URI.
Where Google refuses, it refuses too: a function whose secret environment variable names a version
that cannot be read (``latest`` of a secret with no version, or a disabled one) fails to deploy as
Cloud Run fails its revision (:meth:`FakeGcp._unreadable_secret`).
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pitstop.core.domain import JsonObject
from pitstop.local.json_http import ErrorBody, serve_json

# API prefix -> the gcloud endpoint-override property that routes it here.
OVERRIDES = {
    "serviceusage": "SERVICEUSAGE",
    "iam": "IAM",
    "cloudresourcemanager": "CLOUDRESOURCEMANAGER",
    "logging": "LOGGING",
    "firestore": "FIRESTORE",
    "secretmanager": "SECRETMANAGER",
    "cloudfunctions": "CLOUDFUNCTIONS",
    "run": "RUN",
    "eventarc": "EVENTARC",
    "workflows": "WORKFLOWS",
    "cloudscheduler": "CLOUDSCHEDULER",
    "monitoring": "MONITORING",
    "artifactregistry": "ARTIFACTREGISTRY",
    "cloudbuild": "CLOUDBUILD",
    "storage": "STORAGE",
    "container": "CONTAINER",  # node pools (deploy reads their MIGs), as added by a test
    "pubsub": "PUBSUB",  # IAM here, everything else forwarded to the Pub/Sub emulator
}
# APIs whose mutations answer with a google.longrunning Operation.
LRO_APIS = frozenset({"serviceusage", "firestore", "cloudfunctions", "workflows", "eventarc"})
PROJECT_NUMBER = "424242424242"
# Real Compute permissions a custom role on a project may hold (a subset of what IAM lists).
TESTABLE_PERMISSIONS = frozenset(
    {
        "compute.instances.get",
        "compute.instances.list",
        "compute.instances.reset",
        "compute.instances.start",
        "compute.instances.stop",
        "compute.instances.delete",
        "compute.instances.setLabels",
        "compute.instances.setMetadata",
        "compute.instances.reportHostAsFaulty",
        "compute.instances.performMaintenance",
        "compute.instances.simulateMaintenanceEvent",
        "compute.instanceGroupManagers.get",
        "compute.instanceGroupManagers.list",
        "compute.instanceGroupManagers.update",
        "compute.instanceGroupManagers.delete",
        "compute.zoneOperations.get",
        "compute.zoneOperations.list",
        "compute.globalOperations.get",
        "compute.reservations.get",
        "compute.reservations.list",
    }
)


class ApiError(Exception):
    STATUS = {
        400: "INVALID_ARGUMENT",
        403: "PERMISSION_DENIED",
        404: "NOT_FOUND",
        409: "ALREADY_EXISTS",
        503: "UNAVAILABLE",
    }

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message

    def body(self) -> ErrorBody:
        return {"error": {"code": self.code, "message": self.message, "status": self.STATUS.get(self.code)}}


@dataclass
class Call:
    api: str
    method: str
    path: str  # resource path after the version, verb removed
    verb: str  # the ":verb" custom method, or ""
    query: dict[str, str]
    body: Any

    def __str__(self) -> str:
        return f"{self.method} {self.api} {self.path}{':' + self.verb if self.verb else ''}"


@dataclass
class FakeGcp:
    """Resources by full name per API; IAM policies by resource; every call in order.

    A resource or a policy is kept as the client sent it (merged by later patches), so it is a
    ``JsonObject``: the fake models REST semantics for every kind of resource, not their fields."""

    pubsub_upstream: str | None = None  # the Pub/Sub emulator ("host:port"), which has no IAM
    resources: dict[tuple[str, str], JsonObject] = field(default_factory=dict)
    policies: dict[tuple[str, str], JsonObject] = field(default_factory=dict)
    uploads: dict[str, bytes] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    # project -> its folders and organization, nearest first: ("folder", "123"), ("organization", "9")
    ancestors: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    base_url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    _pending_subscriptions: list[tuple[str, str]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # -- what tests ask ---------------------------------------------------------------
    def policy(self, api: str, name: str) -> JsonObject:
        return self.policies.get((api, name), {"bindings": []})

    def env(self) -> dict[str, str]:
        return {
            f"CLOUDSDK_API_ENDPOINT_OVERRIDES_{prop}": f"{self.base_url}/{api}/"
            for api, prop in OVERRIDES.items()
            if prop
        }

    # -- dispatch ---------------------------------------------------------------------
    def handle(self, method: str, raw_path: str, body: Any) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        segs = [unquote(s) for s in parts.path.strip("/").split("/")]
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        api, rest = segs[0], segs[1:]
        upstream_path = "/" + "/".join(parts.path.strip("/").split("/")[1:])
        # strip the version segment(s): v1, v2, v3, v1beta1 ...
        while rest and re.fullmatch(r"v\d+(?:(?:alpha|beta)\d*)?", rest[0]):
            rest = rest[1:]
        path = "/".join(rest)
        verb = ""
        last = rest[-1] if rest else ""
        if ":" in last and not last.startswith("("):
            head, verb = last.rsplit(":", 1)
            path = "/".join([*rest[:-1], head])
        call = Call(api, method, path, verb, query, body)
        with self.lock:
            self.calls.append(call)
        if api == "pubsub":
            if verb not in ("getIamPolicy", "setIamPolicy"):
                code, res = self._proxy(
                    method, upstream_path + (f"?{parts.query}" if parts.query else ""), body
                )
                if method == "DELETE" and code == 200:
                    with self.lock:
                        self.policies.pop((api, path), None)
                return code, res
            code, res = self._proxy("GET", "/v1/" + path, None)  # the emulator knows what exists
            if code != 200:
                return code, res
        with self.lock:
            try:
                out = self._route(call)
            except ApiError as e:
                return e.code, e.body()
            pending, self._pending_subscriptions = self._pending_subscriptions, []
        for sub, topic in pending:  # Eventarc's push subscription for a Pub/Sub trigger
            if topic:
                self._proxy("PUT", f"/v1/{sub}", {"topic": topic, "ackDeadlineSeconds": 600})
            else:
                self._proxy("DELETE", f"/v1/{sub}", None)
        return 200, out

    def _proxy(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if not self.pubsub_upstream:
            return 404, ApiError(404, "no Pub/Sub emulator behind this fake").body()
        data = json.dumps(body).encode() if body is not None and method != "GET" else None
        req = urllib.request.Request(
            f"http://{self.pubsub_upstream}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 (http://host:port only)
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else {}
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except json.JSONDecodeError:
                return e.code, ApiError(e.code, raw.decode(errors="replace")).body()
        except OSError as e:  # the emulator is down: what a client sees from an unavailable backend
            return 503, ApiError(503, f"Pub/Sub emulator unreachable: {e}").body()

    def _route(self, c: Call) -> Any:
        special = getattr(self, f"_{c.api}", None)
        if special is not None:
            out = special(c)
            if out is not None:
                return out
        if c.verb in ("getIamPolicy", "setIamPolicy"):
            if c.api != "pubsub":  # Pub/Sub resources live in the emulator, checked before
                self._need(c.api, c.path)
            if c.verb == "getIamPolicy":
                return self._policy(c.api, c.path)
            return self._set_policy(c.api, c.path, c.body.get("policy", {}))
        if c.verb:
            raise ApiError(400, f"{c.api}: custom method {c.verb} not modelled")
        if c.method == "GET":
            if (c.api, c.path) in self.resources:
                return self._answer(c.api, self.resources[(c.api, c.path)], lro=False)
            if _is_collection(c.path):
                return self._list(c.api, c.path)
            raise ApiError(404, f"Resource '{c.path}' was not found")
        if c.method == "POST":
            return self._create(c)
        if c.method in ("PATCH", "PUT"):
            res = self._need(c.api, c.path)
            _merge(res, c.body or {}, c.query.get("updateMask"))
            res["name"] = res.get("name", c.path)
            return self._answer(c.api, res)
        if c.method == "DELETE":
            self._need(c.api, c.path)
            del self.resources[(c.api, c.path)]
            self.policies.pop((c.api, c.path), None)
            return self._answer(c.api, {}, at=c.path) if c.api in LRO_APIS else {}
        raise ApiError(400, f"method {c.method} not modelled")

    # -- generic REST semantics ---------------------------------------------------------
    def _need(self, api: str, name: str) -> JsonObject:
        res = self.resources.get((api, name))
        if res is None and api != "cloudresourcemanager":
            raise ApiError(404, f"Resource '{name}' was not found")
        return res if res is not None else {}

    def _create(self, c: Call) -> Any:
        body = copy.deepcopy(c.body or {})  # the recorded request stays as it was sent
        id_key = next((k for k in c.query if k.endswith("Id") and k != "requestId"), None)
        if id_key:
            name = f"{c.path}/{c.query[id_key]}"
        elif isinstance(body.get("name"), str) and body["name"]:
            name = body["name"] if "/" in body["name"] else f"{c.path}/{body['name']}"
        else:
            name = f"{c.path}/{uuid.uuid4().hex[:12]}"
        if (c.api, name) in self.resources:
            raise ApiError(409, f"Resource '{name}' already exists")
        body["name"] = name
        body.setdefault("etag", f"etag-{next(self._ids)}")
        self.resources[(c.api, name)] = body
        return self._answer(c.api, body)

    def _list(self, api: str, coll: str) -> dict[str, list[JsonObject]]:
        key = coll.rsplit("/", 1)[-1]
        items = [
            copy.deepcopy(v)
            for (a, n), v in sorted(self.resources.items())
            if a == api and n.rsplit("/", 1)[0] == coll
        ]
        return {key: items}

    def _answer(self, api: str, res: JsonObject, lro: bool = True, at: str | None = None) -> JsonObject:
        if not (lro and api in LRO_APIS):
            return copy.deepcopy(res)
        n = next(self._ids)
        where = "/".join((at or res.get("name") or "projects/-").split("/")[:4])
        op: JsonObject = {
            "name": f"{where}/operations/op-{n}",
            "done": True,
            "response": copy.deepcopy(res),
        }
        if api == "cloudfunctions":  # gcloud tracks a deploy by the stages in the metadata
            stages = ["BUILD", "SERVICE"] + (["TRIGGER"] if res.get("eventTrigger") else [])
            op["metadata"] = {
                "@type": "type.googleapis.com/google.cloud.functions.v2.OperationMetadata",
                "target": res.get("name", ""),
                "stages": [{"name": st, "state": "COMPLETE"} for st in stages],
            }
        self.resources[(api, op["name"])] = op
        return op

    def _policy(self, api: str, name: str) -> JsonObject:
        return copy.deepcopy(
            self.policies.get((api, name), {"version": 1, "etag": "BwAAAA==", "bindings": []})
        )

    def _set_policy(self, api: str, name: str, policy: JsonObject) -> JsonObject:
        current = self.policies.get((api, name), {"etag": "BwAAAA=="})
        if policy.get("etag") and policy["etag"] != current.get("etag"):
            raise ApiError(409, "There were concurrent policy changes")
        stored = {**policy, "etag": base64.b64encode(f"etag-{next(self._ids)}".encode()).decode()}
        self.policies[(api, name)] = stored
        return copy.deepcopy(stored)

    # -- where Google acts on the caller's behalf ----------------------------------------
    def _cloudresourcemanager(self, c: Call) -> Any:
        m = re.fullmatch(r"projects/([^/]+)", c.path)
        if m and c.method == "GET" and not c.verb:
            return {"projectId": m.group(1), "projectNumber": PROJECT_NUMBER, "lifecycleState": "ACTIVE"}
        if m and c.verb == "getAncestry":
            # the project first, then its parents up to the organization (Resource Manager v1
            # projects.getAncestry: cloud.google.com/resource-manager/reference/rest/v1/projects/getAncestry)
            chain = [("project", m.group(1)), *self.ancestors.get(m.group(1), [])]
            return {"ancestor": [{"resourceId": {"type": t, "id": i}} for t, i in chain]}
        return None

    def _serviceusage(self, c: Call) -> Any:
        if c.verb == "batchEnable":
            for svc in c.body.get("serviceIds", []):
                name = f"{c.path}/{svc}"
                self.resources[("serviceusage", name)] = {"name": name, "state": "ENABLED"}
            return self._answer("serviceusage", {"name": c.path})
        if c.verb == "enable":
            self.resources[("serviceusage", c.path)] = {"name": c.path, "state": "ENABLED"}
            return self._answer("serviceusage", {"name": c.path})
        return None

    def _iam(self, c: Call) -> Any:
        if c.verb == "queryTestablePermissions":
            return {
                "permissions": [
                    {"name": p, "stage": "GA", "customRolesSupportLevel": "SUPPORTED"}
                    for p in sorted(TESTABLE_PERMISSIONS)
                ]
            }
        m = re.fullmatch(r"projects/([^/]+)/serviceAccounts", c.path)
        if m and c.method == "POST":
            project, account = m.group(1), c.body["accountId"]
            email = f"{account}@{project}.iam.gserviceaccount.com"
            name = f"projects/{project}/serviceAccounts/{email}"
            if ("iam", name) in self.resources:
                raise ApiError(409, f"Service account {account} already exists within project")
            sa = {**c.body.get("serviceAccount", {}), "name": name, "email": email, "projectId": project}
            self.resources[("iam", name)] = sa
            return copy.deepcopy(sa)
        m = re.fullmatch(r"projects/-/serviceAccounts/([^/]+)", c.path)
        if m:  # gcloud addresses accounts by email under the wildcard project
            email = m.group(1)
            real = f"projects/{email.split('@')[1].split('.')[0]}/serviceAccounts/{email}"
            return self._route(Call(c.api, c.method, real, c.verb, c.query, c.body))
        m = re.fullmatch(r"(projects/[^/]+/roles)", c.path)
        if m and c.method == "POST":
            name = f"{m.group(1)}/{c.body['roleId']}"
            if ("iam", name) in self.resources:
                raise ApiError(409, f"A role named {c.body['roleId']} in {m.group(1)} already exists.")
            role = {**c.body.get("role", {}), "name": name, "etag": "BwAAAA=="}
            self.resources[("iam", name)] = role
            return copy.deepcopy(role)
        if re.fullmatch(r"projects/[^/]+/roles/[^/]+", c.path) and c.method != "GET":
            return self._custom_role(c)
        return None

    def _custom_role(self, c: Call) -> Any:
        """Deleting a custom role only marks it deleted (undeletable for 7 days; the id stays taken)."""
        role = self._need("iam", c.path)
        if c.method == "DELETE":
            role["deleted"] = True
            return copy.deepcopy(role)
        if c.verb == "undelete":
            if not role.get("deleted"):
                raise ApiError(400, f"Role {c.path} is not deleted.")
            role.pop("deleted")
            return copy.deepcopy(role)
        if c.method == "PATCH" and role.get("deleted"):
            raise ApiError(400, f"You can't update a deleted role: {c.path}")
        return None

    def _logging(self, c: Call) -> Any:
        if c.method == "POST" and c.path.endswith("/sinks") and not c.verb:
            sink = self._create(c)
            kind, parent = c.path.split("/")[:2]  # projects/P, folders/F or organizations/O
            agent = {
                "projects": PROJECT_NUMBER,
                "folders": f"folder-{parent}",
                "organizations": f"org-{parent}",
            }
            sink["writerIdentity"] = (
                f"serviceAccount:service-{agent[kind]}@gcp-sa-logging.iam.gserviceaccount.com"
            )
            self.resources[("logging", sink["name"])]["writerIdentity"] = sink["writerIdentity"]
            return sink
        return None

    def _cloudfunctions(self, c: Call) -> Any:
        if c.method == "DELETE" and not c.verb:  # the function takes its service and trigger with it
            doomed = self.resources.get(("cloudfunctions", c.path)) or {}
            self.resources.pop(("run", doomed.get("serviceConfig", {}).get("service", "")), None)
            self.policies.pop(("run", doomed.get("serviceConfig", {}).get("service", "")), None)
            gone = self.resources.pop(("eventarc", doomed.get("eventTrigger", {}).get("trigger", "")), None)
            if gone:
                self._pending_subscriptions.append((gone["transport"]["pubsub"]["subscription"], ""))
            return None
        if c.method == "GET" and c.path.endswith("/runtimes"):
            return {
                "runtimes": [
                    {"name": r, "displayName": r, "stage": "GA", "environment": "GEN_2"}
                    for r in ("python310", "python311", "python312", "python313", "nodejs20", "go122")
                ]
            }
        if c.verb == "generateUploadUrl":
            obj = f"fn-source-{next(self._ids)}.zip"
            return {
                "uploadUrl": f"{self.base_url}/upload/{obj}",
                "storageSource": {"bucket": "gcf-v2-uploads", "object": obj},
            }
        if c.method in ("POST", "PATCH") and not c.verb:
            m = re.fullmatch(r"(projects/([^/]+)/locations/([^/]+))/functions(?:/([^/]+))?", c.path)
            if not m:
                return None
            where, project, region = m.group(1), m.group(2), m.group(3)
            fn = m.group(4) or c.query.get("functionId", "")
            name = f"{where}/functions/{fn}"
            before = copy.deepcopy(self.resources.get(("cloudfunctions", name)))
            out = self._create(c) if c.method == "POST" else None
            if out is None:
                res = self._need("cloudfunctions", name)
                _merge(res, c.body or {}, c.query.get("updateMask"))
            res = self.resources[("cloudfunctions", name)]
            why = self._unreadable_secret(project, res)
            if why is not None:  # a new function stays, FAILED; an update leaves the one serving as it was
                if before is None:
                    res["state"] = "FAILED"  # "Function deployment failed and function is not serving."
                else:
                    self.resources[("cloudfunctions", name)] = before
                return self._failed_deploy(res, why)
            res["state"] = "ACTIVE"
            res.setdefault("environment", "GEN_2")
            svc = res.setdefault("serviceConfig", {})
            svc["service"] = f"{where}/services/{fn}"
            svc["uri"] = f"https://{fn}-{uuid.uuid5(uuid.NAMESPACE_DNS, project).hex[:10]}-uc.a.run.app"
            self.resources.setdefault(("run", svc["service"]), {"name": svc["service"], "uri": svc["uri"]})
            trig = res.get("eventTrigger")
            if trig and trig.get("pubsubTopic"):
                trigger = f"{where}/triggers/{fn}-{next(self._ids):06d}"
                trig["trigger"] = trig.get("trigger") or trigger
                sub = f"eventarc-{region}-{fn}-{trigger.rsplit('-', 1)[-1]}-sub-{next(self._ids):03d}"
                if ("eventarc", trig["trigger"]) not in self.resources:
                    self.resources[("eventarc", trig["trigger"])] = {
                        "name": trig["trigger"],
                        "transport": {
                            "pubsub": {
                                "topic": trig["pubsubTopic"],
                                "subscription": f"projects/{project}/subscriptions/{sub}",
                            }
                        },
                    }
                    self._pending_subscriptions.append(
                        (f"projects/{project}/subscriptions/{sub}", trig["pubsubTopic"])
                    )
            return self._answer("cloudfunctions", res)
        return None

    def _secretmanager(self, c: Call) -> Any:
        """Versions: numbered from 1, ENABLED when added; `latest` is the most recently created one.

        cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets.versions/access:
        "projects/*/secrets/*/versions/latest is an alias to the most recently created SecretVersion".
        """
        secret = re.fullmatch(r"projects/[^/]+/secrets/[^/]+", c.path)
        if secret and c.verb == "addVersion":
            self._need("secretmanager", c.path)
            n = 1 + len(self._versions(c.path))
            payload = (c.body or {}).get("payload", {})
            name = f"{c.path}/versions/{n}"
            version: JsonObject = {
                "name": name,
                "state": "ENABLED",
                "createTime": f"2026-01-01T00:00:{n:02d}Z",
                "replicationStatus": {"automatic": {}},
                "clientSpecifiedPayloadChecksum": "dataCrc32c" in payload,  # gcloud refuses a version without
                "etag": f'"{next(self._ids)}"',
                "payload": payload,  # kept (what `secrets create --data-file` sent), never answered
            }
            self.resources[("secretmanager", name)] = version
            return {k: copy.deepcopy(v) for k, v in version.items() if k != "payload"}
        if secret and c.method == "DELETE" and not c.verb:  # a secret takes its versions with it
            for name in self._versions(c.path):
                del self.resources[("secretmanager", name)]
            return None
        latest = re.fullmatch(r"(projects/[^/]+/secrets/[^/]+)/versions/latest", c.path)
        if latest and c.method == "GET" and not c.verb:
            versions = self._versions(latest.group(1))
            if not versions:
                raise ApiError(404, f"Secret [{latest.group(1)}] not found or has no versions.")
            got = self.resources[("secretmanager", versions[-1])]
            return {k: copy.deepcopy(v) for k, v in got.items() if k != "payload"}
        return None

    def _versions(self, secret: str) -> list[str]:
        """A secret's version names, oldest first."""
        names = [
            n for (a, n) in self.resources if a == "secretmanager" and n.startswith(f"{secret}/versions/")
        ]
        return sorted(names, key=lambda n: int(n.rsplit("/", 1)[1]))

    def _unreadable_secret(self, project: str, fn: JsonObject) -> str | None:
        """Why Cloud Run would not start the function's revision, if a secret it reads is unreadable.

        A secret environment variable is resolved before an instance starts, so a version that does
        not exist or is disabled fails the revision, and with it the deploy
        (cloud.google.com/run/docs/configuring/services/secrets, "How secrets are checked at
        deployment and runtime"). Cloud Run's message names the variable's place in the container's
        env and the version by project number: "Revision 'R' is not ready and cannot serve traffic.
        spec.template.spec.containers[0].env[N].value_from.secret_key_ref.name: Secret
        projects/NUMBER/secrets/S/versions/V was not found".
        """
        svc = fn.get("serviceConfig") or {}
        plain = len(svc.get("environmentVariables") or {})
        for i, ref in enumerate(svc.get("secretEnvironmentVariables") or []):
            owner = ref.get("projectId") or project  # gcloud names it by number: every project's is one
            secret = f"projects/{project if owner == PROJECT_NUMBER else owner}/secrets/{ref['secret']}"
            versions = self._versions(secret)
            wanted = (
                versions[-1:]
                if ref.get("version") == "latest"
                else [f"{secret}/versions/{ref.get('version')}"]
            )
            found = [self.resources.get(("secretmanager", v)) for v in wanted]
            if not found or found[0] is None or found[0].get("state") != "ENABLED":
                revision = f"{fn['name'].rsplit('/', 1)[1]}-{next(self._ids):05d}-fak"
                return (
                    f"Revision '{revision}' is not ready and cannot serve traffic. "
                    f"spec.template.spec.containers[0].env[{plain + i}].value_from.secret_key_ref.name: "
                    f"Secret projects/{PROJECT_NUMBER}/secrets/{ref['secret']}/versions/{ref.get('version')} "
                    "was not found"
                )
        return None

    def _failed_deploy(self, fn: JsonObject, why: str) -> JsonObject:
        """The deploy's operation, done with Cloud Functions' error (FAILED_PRECONDITION, as Cloud Run
        reports a revision whose secret it cannot read) and the build stage complete."""
        short = fn["name"].rsplit("/", 1)[1]
        op: JsonObject = {
            "name": f"{'/'.join(fn['name'].split('/')[:4])}/operations/op-{next(self._ids)}",
            "done": True,
            "error": {"code": 9, "message": f"Could not create or update Cloud Run service {short}, {why}"},
            "metadata": {
                "@type": "type.googleapis.com/google.cloud.functions.v2.OperationMetadata",
                "target": fn["name"],
                "stages": [{"name": "BUILD", "state": "COMPLETE"}, {"name": "SERVICE", "state": "COMPLETE"}],
            },
        }
        self.resources[("cloudfunctions", op["name"])] = op
        return op

    def _cloudbuild(self, c: Call) -> Any:
        if c.method == "GET" and c.path.endswith("/defaultServiceAccount"):
            project = c.path.split("/")[1]
            email = f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
            return {"name": c.path, "serviceAccountEmail": f"projects/{project}/serviceAccounts/{email}"}
        return None

    def _firestore(self, c: Call) -> Any:
        m = re.fullmatch(r"(projects/[^/]+/databases/[^/]+)/collectionGroups/[^/]+/fields/[^/]+", c.path)
        if m and c.method == "PATCH":  # every field has an index config; the database must exist
            self._need("firestore", m.group(1))
            self.resources.setdefault(("firestore", c.path), {"name": c.path})
        return None

    def _eventarc(self, c: Call) -> Any:
        """A trigger on a Pub/Sub topic gets its push subscription, named as Eventarc names them."""
        m = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)/triggers", c.path)
        if m and c.method == "POST" and not c.verb:
            out = self._create(c)
            res = self.resources[("eventarc", out["response"]["name"])]
            pubsub = res.setdefault("transport", {}).setdefault("pubsub", {})
            trigger = c.query.get("triggerId", "trigger")
            sub_id = f"eventarc-{m.group(2)}-{trigger}-sub-{next(self._ids):03d}"
            sub = f"projects/{m.group(1)}/subscriptions/{sub_id}"
            pubsub["subscription"] = sub
            self._pending_subscriptions.append((sub, pubsub.get("topic", "")))
            out["response"] = copy.deepcopy(res)
            return out
        if c.method == "DELETE" and not c.verb and ("eventarc", c.path) in self.resources:
            sub = (
                self.resources[("eventarc", c.path)]
                .get("transport", {})
                .get("pubsub", {})
                .get("subscription")
            )
            if sub:
                self._pending_subscriptions.append((sub, ""))
        return None

    def _container(self, c: Call) -> Any:
        """Node pools live in their cluster: listing those of a cluster that is not there is a 404,
        as the Container API answers (projects.locations.clusters.nodePools.list)."""
        m = re.fullmatch(r"(projects/[^/]+/locations/[^/]+/clusters/[^/]+)/nodePools", c.path)
        if m and c.method == "GET":
            self._need("container", m.group(1))
        return None

    def _monitoring(self, c: Call) -> Any:
        m = re.fullmatch(r"projects/([^/]+)/(dashboards|alertPolicies|notificationChannels)", c.path)
        if m and c.method == "POST" and not c.verb:
            body = dict(c.body or {})
            body.pop("name", None)  # the service names new dashboards, policies and channels itself
            return self._create(Call(c.api, c.method, c.path, c.verb, {}, body))
        policy = re.fullmatch(r"projects/[^/]+/alertPolicies/[^/]+", c.path)
        if policy and c.method == "PATCH" and not c.query.get("updateMask"):
            # "If this field is empty, then the supplied alerting policy replaces the existing policy"
            # (cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies/patch, updateMask):
            # the same name, every other field the request's; a field it leaves out is gone.
            old = self._need(c.api, c.path)
            new = {**copy.deepcopy(dict(c.body or {})), "name": c.path}
            if "creationRecord" in old:
                new["creationRecord"] = old["creationRecord"]
            self.resources[(c.api, c.path)] = new
            return self._answer(c.api, new)
        return None


def _is_collection(path: str) -> bool:
    return len(path.split("/")) % 2 == 1


def _merge(res: JsonObject, body: Mapping[str, object], mask: str | None) -> None:
    if not mask:
        res.update(copy.deepcopy(body))
        return
    for field_path in mask.split(","):
        keys = [_camel(k) for k in field_path.strip().split(".")]
        src: Any = body
        for k in keys:
            src = src.get(k) if isinstance(src, dict) else None
        dst = res
        for k in keys[:-1]:
            dst = dst.setdefault(k, {})
        if src is None:
            dst.pop(keys[-1], None)
        else:
            dst[keys[-1]] = copy.deepcopy(src)


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def serve(fake: FakeGcp, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    def dispatch(method: str, path: str, raw: bytes) -> tuple[int, Any]:
        if path.startswith("/upload/"):  # the signed URL a source archive is PUT to
            with fake.lock:
                fake.uploads[path.rsplit("/", 1)[-1]] = raw
            return 200, {}
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = {"_raw": raw.decode(errors="replace")}
        return fake.handle(method, path, body)

    server = serve_json(dispatch, "fake-gcp", host, port)
    fake.base_url = f"http://{host}:{server.server_address[1]}"
    return server
