"""ValidatingAdmissionPolicy in the fake Kubernetes API server (local/fake_k8s.py).

Pitstop deploys one (infra/gke/clusterrole.yaml: actuate may change only ``spec.suspend`` and its
``pitstop.dev/`` annotations of a JobSet or Job). The fake enforces the policies and bindings
applied to it, so every GKE path the local stack runs goes through the deployed policy, as on GKE.

What the API server does, as documented (kubernetes.io/docs/reference/access-authn-authz/
validating-admission-policy/ and the API reference's ValidatingAdmissionPolicy v1 page):

- a binding (``policyName``) puts a policy into effect; a binding naming no policy is ignored.
- a request is checked when it matches the policy's ``matchConstraints`` and the binding's
  ``matchResources`` (``resourceRules`` on group, version, operation, resource[/subresource] and
  scope; ``excludeResourceRules``; ``namespaceSelector``; ``objectSelector`` on the old or the
  new object's labels), then when every ``matchConditions`` expression is true.
- CEL variables ``object`` (null for DELETE), ``oldObject`` (null for CREATE) and ``request`` (the
  AdmissionRequest: ``userInfo.username``, ``operation``, ``name``, ``namespace``...).
- a validation that is false denies with its ``message`` (else ``failed expression: <expr>``);
  an expression that fails (a missing key, not a bool, does not compile) follows
  ``failurePolicy`` (default Fail: denied; Ignore: skipped), a match condition's error too.
- only ``validationActions: [Deny]`` refuses; Warn and Audit let the request through.
- the refusal: ``Status`` with ``reason`` the validation's ``reason`` (default ``Invalid``), its
  HTTP code (Invalid 422, Forbidden 403, Unauthorized 401, RequestEntityTooLarge 413), message
  ``<resource>.<group> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding
  '<binding>' denied request: <message>`` and that message again as the one cause
  (k8s.io/apiserver pkg/admission/plugin/policy/validating/dispatcher.go builds it that way:
  ``admission.NewForbidden`` whose reason and code are replaced).

Not supported (a policy or binding that uses them is refused when applied, never half-enforced):
``paramKind``/``paramRef``, ``variables``, ``auditAnnotations``, ``messageExpression``. Policies
never apply to policies and bindings themselves, as on a real server. CEL is cel-python's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pitstop.local.k8s_patch import selector_matches
from pitstop.local.k8s_store import BY_KIND, ApiError, Obj, Resource, Store, invalid

if TYPE_CHECKING:
    import celpy

GROUP = "admissionregistration.k8s.io"
POLICY, BINDING = "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"
ANONYMOUS = "system:anonymous"
UNSUPPORTED = {
    POLICY: (("spec", "paramKind"), ("spec", "variables"), ("spec", "auditAnnotations")),
    BINDING: (("spec", "paramRef"),),
}
CODES = {"Invalid": 422, "Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413}


@dataclass(frozen=True)
class Request:
    """Who asks what of which object: the AdmissionRequest a policy sees as ``request``."""

    user: str
    groups: tuple[str, ...]
    operation: str  # CREATE, UPDATE or DELETE
    res: Resource
    sub: str
    name: str
    namespace: str | None

    def cel(self) -> Obj:
        gvk = {"group": self.res.group, "version": self.res.version, "kind": self.res.kind}
        gvr = {"group": self.res.group, "version": self.res.version, "resource": self.res.plural}
        return {
            "kind": gvk,
            "resource": gvr,
            "subResource": self.sub,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": self.name,
            "namespace": self.namespace or "",
            "operation": self.operation,
            "userInfo": {"username": self.user, "groups": list(self.groups)},
            "dryRun": False,
        }


class DeniedError(Exception):
    """One binding's refusal: its message and the Status reason it answers with."""

    def __init__(self, message: str, reason: str = "Invalid") -> None:
        super().__init__(message)
        self.message, self.reason = message, reason if reason in CODES else "Invalid"


def check_supported(kind: str, obj: Obj) -> None:
    """A policy or binding using what the fake does not evaluate is refused when applied."""
    for path in UNSUPPORTED.get(kind, ()):
        if (obj.get(path[0]) or {}).get(path[1]):
            msg = f"Unsupported value: {'.'.join(path)} is not evaluated by the fake API server"
            raise invalid(BY_KIND[kind], obj["metadata"].get("name", ""), ".".join(path), msg)
    validations = ((obj.get("spec") or {}).get("validations") or []) if kind == POLICY else []
    for v in validations:
        if v.get("messageExpression"):
            msg = "Unsupported value: messageExpression is not evaluated by the fake API server"
            raise invalid(BY_KIND[kind], obj["metadata"].get("name", ""), "spec.validations", msg)


def _rule_matches(rule: Obj, req: Request) -> bool:
    def has(key: str, value: str) -> bool:
        got = rule.get(key) or []
        return "*" in got or value in got

    scope = rule.get("scope") or "*"
    if scope != "*" and scope != ("Namespaced" if req.res.namespaced else "Cluster"):
        return False
    wanted = f"{req.res.plural}/{req.sub}" if req.sub else req.res.plural
    resources = rule.get("resources") or []
    resource_ok = (
        wanted in resources
        or "*/*" in resources
        or (not req.sub and "*" in resources)
        or (req.sub != "" and (f"{req.res.plural}/*" in resources or f"*/{req.sub}" in resources))
    )
    return (
        resource_ok
        and has("apiGroups", req.res.group)
        and has("apiVersions", req.res.version)
        and has("operations", req.operation)
    )


class Policies:
    """The policies and bindings in a store, checked against each write that reaches the API."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._programs: dict[str, celpy.Runner] = {}  # CEL expression -> its compiled program
        self.decisions: list[Obj] = []  # every binding that applied to a request: what it decided

    def review(self, req: Request, old: Obj | None, new: Obj | None) -> None:
        """Raise the API server's refusal if a Deny binding's policy refuses the request."""
        if req.res.group == GROUP:
            return
        for binding in self.store.list(BINDING):
            policy = self.store.get(POLICY, str((binding.get("spec") or {}).get("policyName") or ""))
            verdict = False if policy is None else self._matches(policy, binding, req, old, new)
            if policy is None or verdict is False:
                continue
            try:
                if isinstance(verdict, str):  # a match condition failed to evaluate, failurePolicy Fail
                    raise DeniedError(verdict)
                self._validate(policy, req, old, new)
            except DeniedError as denied:
                self._record(policy, binding, req, denied.message)
                if "Deny" in ((binding.get("spec") or {}).get("validationActions") or []):
                    raise refusal(req, policy, binding, denied) from None
                continue
            self._record(policy, binding, req, None)

    def _record(self, policy: Obj, binding: Obj, req: Request, denied: str | None) -> None:
        self.decisions.append(
            {
                "policy": policy["metadata"]["name"],
                "binding": binding["metadata"]["name"],
                "user": req.user,
                "operation": req.operation,
                "resource": req.res.qualified,
                "namespace": req.namespace,
                "name": req.name,
                "allowed": denied is None,
                **({"message": denied} if denied else {}),
            }
        )

    def _matches(
        self, policy: Obj, binding: Obj, req: Request, old: Obj | None, new: Obj | None
    ) -> bool | str:
        constraints = (policy.get("spec") or {}).get("matchConstraints") or {}
        scoped = (binding.get("spec") or {}).get("matchResources")
        if not self._in(constraints, req, old, new, require_rules=True):
            return False
        if scoped is not None and not self._in(scoped, req, old, new, require_rules=False):
            return False
        return self._conditions(policy, req, old, new)

    def _in(self, mr: Obj, req: Request, old: Obj | None, new: Obj | None, *, require_rules: bool) -> bool:
        """MatchResources: rules (a binding without rules takes all its policy matched), exclusions,
        the namespace's labels (a cluster-scoped object other than a Namespace is never skipped by
        them) and the object's labels, old or new."""
        rules = mr.get("resourceRules") or []
        if (rules or require_rules) and not any(_rule_matches(r, req) for r in rules):
            return False
        if any(_rule_matches(r, req) for r in mr.get("excludeResourceRules") or []):
            return False
        labels = [((o or {}).get("metadata") or {}).get("labels") for o in (old, new) if o is not None]
        if not any(selector_matches(mr.get("objectSelector"), lab) for lab in labels or [None]):
            return False
        if req.res.kind == "Namespace":
            return any(selector_matches(mr.get("namespaceSelector"), lab) for lab in labels or [None])
        if not req.res.namespaced:
            return True
        ns = self.store.get("Namespace", req.namespace or "default") or {}
        return selector_matches(mr.get("namespaceSelector"), (ns.get("metadata") or {}).get("labels"))

    def _conditions(self, policy: Obj, req: Request, old: Obj | None, new: Obj | None) -> bool | str:
        """True when every match condition is; one false skips the policy; an error (none false) is
        the failure policy's: Fail denies (the error returned), Ignore skips."""
        errors: list[str] = []
        for cond in (policy.get("spec") or {}).get("matchConditions") or []:
            try:
                if not self._eval(cond["expression"], req, old, new):
                    return False
            except DeniedError as err:
                errors.append(f"failed to evaluate match condition '{cond.get('name')}': {err.message}")
        if errors:
            return errors[0] if _fails_closed(policy) else False
        return True

    def _validate(self, policy: Obj, req: Request, old: Obj | None, new: Obj | None) -> None:
        """Each validation; the first false (or failed, failurePolicy Fail) one is ``DeniedError``."""
        for v in (policy.get("spec") or {}).get("validations") or []:
            try:
                ok = self._eval(v["expression"], req, old, new)
            except DeniedError:
                if not _fails_closed(policy):
                    continue
                raise
            if not ok:
                raise DeniedError(
                    v.get("message") or f"failed expression: {v['expression']}", v.get("reason") or ""
                )

    def _eval(self, expr: str, req: Request, old: Obj | None, new: Obj | None) -> bool:
        """One CEL expression over the request; any failure (or a non-bool) is ``DeniedError`` with the
        API server's "expression '...' resulted in error" wording, for the failure policy to judge."""
        import celpy
        from celpy.adapter import json_to_cel

        try:
            program = self._programs.get(expr)
            if program is None:
                env = celpy.Environment()
                program = self._programs[expr] = env.program(env.compile(expr))
            activation = {"object": new, "oldObject": old, "request": req.cel()}
            out = program.evaluate({k: json_to_cel(v) for k, v in activation.items()})
        except Exception as err:  # CELParseError, CELEvalError: the expression's own failure
            raise DeniedError(f"expression '{expr}' resulted in error: {err}") from err
        if not isinstance(out, celpy.celtypes.BoolType):
            raise DeniedError(f"expression '{expr}' resulted in error: a {type(out).__name__}, not a bool")
        return bool(out)


def _fails_closed(policy: Obj) -> bool:
    return str((policy.get("spec") or {}).get("failurePolicy") or "Fail") == "Fail"


def refusal(req: Request, policy: Obj, binding: Obj, denied: DeniedError) -> ApiError:
    """The API server's answer to a denied request (see the module docstring)."""
    said = (
        f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding "
        f"'{binding['metadata']['name']}' denied request: {denied.message}"
    )
    prefix = f'{req.res.qualified} "{req.name}" is forbidden: ' if req.name else "forbidden: "
    details = {
        "name": req.name,
        "group": req.res.group,
        "kind": req.res.plural,
        "causes": [{"message": said}],
    }
    return ApiError(CODES[denied.reason], denied.reason, prefix + said, details)
