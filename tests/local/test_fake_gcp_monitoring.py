"""The fake Google APIs' Monitoring alert policies: a PATCH without ``updateMask`` replaces the policy
("If this field is empty, then the supplied alerting policy replaces the existing policy":
https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies/patch), one with a
mask changes only the fields it names; the service names a new policy itself."""

from __future__ import annotations

from typing import Any

from pitstop.local.fake_gcp import FakeGcp

POLICIES = "/monitoring/v3/projects/p-1/alertPolicies"


def created(fake: FakeGcp) -> dict[str, Any]:
    body = {"name": "mine", "displayName": "Pitstop: hang", "documentation": {"content": "old"},
            "conditions": [{"displayName": "c"}], "creationRecord": {"mutateTime": "t0"}}  # fmt: skip
    code, out = fake.handle("POST", POLICIES, body)
    assert code == 200 and out["name"].startswith("projects/p-1/alertPolicies/") and out["name"] != "mine"
    return dict(out)


def test_a_patch_without_an_update_mask_replaces_the_policy() -> None:
    fake = FakeGcp()
    name = created(fake)["name"]
    code, out = fake.handle("PATCH", f"/monitoring/v3/{name}", {"displayName": "Pitstop: hang v2"})
    assert code == 200
    stored = fake.resources[("monitoring", name)]
    assert (
        stored
        == out
        == {"displayName": "Pitstop: hang v2", "name": name, "creationRecord": {"mutateTime": "t0"}}
    )


def test_a_patch_with_an_update_mask_changes_only_those_fields() -> None:
    fake = FakeGcp()
    name = created(fake)["name"]
    body = {"displayName": "renamed", "documentation": {"content": "new"}}
    code, _ = fake.handle("PATCH", f"/monitoring/v3/{name}?updateMask=documentation.content", body)
    stored = fake.resources[("monitoring", name)]
    assert (
        code == 200
        and stored["displayName"] == "Pitstop: hang"
        and stored["documentation"] == {"content": "new"}
    )
    assert stored["conditions"] == [{"displayName": "c"}]
