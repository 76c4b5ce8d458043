"""Patch and selector semantics of the fake Kubernetes API server (local/fake_k8s.py).

Three PATCH formats reach a real API server from kubectl and the Python client (reference/gke.md §7):

- strategic merge (``application/strategic-merge-patch+json``): kubectl cordon, taint and drain;
  the Python client for a dict body. Lists with a ``patchMergeKey`` in the Go types merge
  element-wise by that key (``conditions`` by ``type``, ``containers`` by ``name`` ...), lists
  with ``patchStrategy: merge`` and no key (``finalizers``) merge as sets, and every other list
  (``taints``, ``tolerations``, ``args`` ...) is replaced whole. Directives ``$patch`` (replace /
  delete / merge), ``$deleteFromPrimitiveList/<field>`` and ``$retainKeys`` are honoured;
  ``$setElementOrder/<field>`` is accepted and ignored (it only orders the result). The merge keys
  below are chosen by field name, not by the full Go type path: good enough for the objects the
  fake serves.
- JSON merge patch (RFC 7386, ``application/merge-patch+json``): kubectl label and
  ``patch --type=merge``; ``CustomObjectsApi``. ``null`` deletes, lists replace.
- JSON patch (RFC 6902, ``application/json-patch+json``): a Python client list body.

Selectors: ``labelSelector`` (equality, ``!=``, ``in``, ``notin``, existence ``k`` and ``!k``),
``fieldSelector`` (``=``, ``==``, ``!=`` on dotted paths such as ``spec.nodeName``), and the
``LabelSelector`` object of PDBs and Jobs (``matchLabels`` and ``matchExpressions``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from pitstop.core.domain import JsonObject

# A Kubernetes object as the fake API server stores it: whatever the client sent, of any kind,
# changed only by the API's own rules (metadata, patches, defaults): open shape by nature.
Obj = JsonObject

# field name -> patchMergeKey, from the Go API types (k8s.io/api core/v1, batch/v1, meta/v1).
MERGE_KEYS: dict[str, str] = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "env": "name",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "addresses": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
}
# lists with patchStrategy "merge" and no merge key: merged as sets of primitives.
SET_LISTS = frozenset({"finalizers"})


class PatchError(ValueError):
    """A patch that cannot be applied: the server answers 422 (Invalid) or 400."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: Obj = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(target: Any, patch: Any) -> Any:
    """Apply a strategic merge patch to ``target`` (see the module docstring for the rules)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result: Obj = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
        elif key.startswith("$"):
            continue
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            merged = strategic_merge(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    """Merge one list field: by merge key, as a set, or replace it whole."""
    base = list(copy.deepcopy(current)) if isinstance(current, list) else []
    if field in SET_LISTS:
        return base + [v for v in patch if v not in base]
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(item, dict) for item in patch):
        if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
            return [item for item in patch if not (isinstance(item, dict) and "$patch" in item)]
        return copy.deepcopy(patch)
    if any(item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(item) for item in patch if "$patch" not in item]
    for item in patch:
        idx = next(
            (i for i, cur in enumerate(base) if isinstance(cur, dict) and cur.get(key) == item.get(key)), None
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                base.pop(idx)
        elif idx is None:
            base.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            base[idx] = strategic_merge(base[idx], item)
    return base


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str]) -> tuple[Any, str]:
    """The object or list holding the last element of ``parts``, and that element's key."""
    node = doc
    for part in parts[:-1]:
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise PatchError(f"index {part} out of range")
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise PatchError(f"path element {part!r} not found")
    return node, parts[-1]


def _read(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    node, last = _container(doc, parts)
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        return node[int(last)]
    if isinstance(node, dict) and last in node:
        return node[last]
    raise PatchError(f"path {path!r} not found")


def _write(doc: Any, path: str, value: Any, *, insert: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    node, last = _container(doc, parts)
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last) if last.isdigit() else -1
        if index < 0 or index > len(node) or (not insert and index == len(node)):
            raise PatchError(f"index {last} out of range")
        if insert:
            node.insert(index, value)
        else:
            node[index] = value
    elif isinstance(node, dict):
        if not insert and last not in node:
            raise PatchError(f"path {path!r} not found")
        node[last] = value
    else:
        raise PatchError(f"cannot write into {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    node, last = _container(doc, parts)
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        node.pop(int(last))
    elif isinstance(node, dict) and last in node:
        del node[last]
    else:
        raise PatchError(f"path {path!r} not found")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 add / remove / replace / move / copy / test, all or nothing."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "path" not in op:
            raise PatchError(f"invalid operation {op!r}")
        kind, path = op.get("op"), op["path"]
        if kind == "add":
            doc = _write(doc, path, copy.deepcopy(op.get("value")), insert=True)
        elif kind == "replace":
            doc = _write(doc, path, copy.deepcopy(op.get("value")), insert=False)
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_read(doc, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, op["from"])
            doc = _write(doc, path, value, insert=True)
        elif kind == "test":
            if _read(doc, path) != op.get("value"):
                raise PatchError(f"testing value {path} failed")
        else:
            raise PatchError(f"unknown operation {kind!r}")
    return doc


# --- selectors -------------------------------------------------------------------------------

_SET_TERM = re.compile(r"^\s*(\S+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses: ``a in (x,y),b=c`` is two terms."""
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def labels_match(selector: str | None, labels: Mapping[str, str] | None) -> bool:
    """Does a ``labelSelector`` query string select these labels?"""
    labels = labels or {}
    for term in _split_terms(selector or ""):
        m = _SET_TERM.match(term)
        if m:
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            ok = labels.get(key) in values if op == "in" else labels.get(key) not in values
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            ok = labels.get(key) != value
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            ok = labels.get(key) == value
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


def field_value(obj: Obj, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        return ""
    return str(node).lower() if isinstance(node, bool) else str(node)


def fields_match(selector: str | None, obj: Obj) -> bool:
    """Does a ``fieldSelector`` query string (``spec.nodeName=n1,status.phase!=Failed``) select ``obj``?"""
    for term in _split_terms(selector or ""):
        if "!=" in term:
            path, value = term.split("!=", 1)
            ok = field_value(obj, path.strip()) != value.strip()
        else:
            path, value = term.replace("==", "=").split("=", 1)
            ok = field_value(obj, path.strip()) == value.strip()
        if not ok:
            return False
    return True


def selector_matches(selector: Obj | None, labels: Mapping[str, str] | None) -> bool:
    """A ``metav1.LabelSelector`` object: matchLabels AND every matchExpression (empty selects all)."""
    labels = labels or {}
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and key in labels and labels[key] in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True
