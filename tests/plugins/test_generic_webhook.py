"""The generic webhook channel: the notification as signed JSON, through the local stack's sink.

The signature is HMAC-SHA256 (RFC 2104 HMAC over FIPS 180-4 SHA-256) of "<unix time>." + body;
the check is the receiver's side of it (plugins/channels/generic_webhook/local.py answers as a
receiver must: 401 for a bad or stale signature). Delivered for real: the channel posts over HTTP
to ``python -m pitstop.local.serve webhook`` (every channel folder's sink on one port).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pitstop.local import procs
from pitstop.plugins.channels.generic_webhook import GenericWebhook, body, local
from pitstop.services import channels

T0 = 1_800_000_000
NOTE = {
    "id": "incident-ifailed123-0123456789abcdef",
    "kind": "incident",
    "severity": "critical",
    "summary": "Remediation of a3-node-007 FAILED at act",
    "incident": {
        "id": "ifailed123",
        "node": {"instance": "a3-node-007"},
        "cluster": "train",
        "state": "FAILED",
    },
    "unknown_field": "not passed on",
}


def test_the_body_is_the_notification_and_its_text_serialised_one_way() -> None:
    data = body.payload(NOTE)
    doc = json.loads(data)
    assert doc["id"] == NOTE["id"] and doc["incident"]["cluster"] == "train"
    assert doc["schema"] == "pitstop.notification/v1" and "a3-node-007" in doc["text"]
    assert "unknown_field" not in doc
    assert body.payload(dict(reversed(list(NOTE.items())))) == data  # same bytes whatever the order


def test_the_signature_is_rfc2104_hmac_sha256_of_the_time_and_the_body() -> None:
    key, data = b"k3y", body.payload(NOTE)
    header = body.signature(key, data, T0)
    expected = hmac.new(key, f"{T0}.".encode() + data, hashlib.sha256).hexdigest()
    assert header == f"t={T0},v1={expected}"
    assert body.verify(key, data, header, T0 + 10)
    assert not body.verify(b"other", data, header, T0)  # another key
    assert not body.verify(key, data + b" ", header, T0)  # another body
    assert not body.verify(key, data, header, T0 + body.TOLERANCE_S + 1)  # replayed later
    assert not body.verify(key, data, None, T0) and not body.verify(key, data, "v1=abc", T0)


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port, out = procs.free_port(), tmp_path / "webhook.jsonl"
    argv = [sys.executable, "-m", "pitstop.local.serve", "webhook", "--port", str(port), "--out", str(out)]
    proc = procs.Proc("webhook", argv, tmp_path / "webhook.log").start()
    base = f"http://127.0.0.1:{port}"
    try:
        procs.wait_http(base + "/", proc, accept_errors=True)
        yield base, out
    finally:
        proc.stop()


def _generic(env: dict[str, str]) -> GenericWebhook:
    found = [c for c in channels.configured(env) if c.name == "generic_webhook"]
    assert len(found) == 1 and isinstance(found[0], GenericWebhook)
    return found[0]


def test_a_signed_notification_reaches_the_local_receiver_once_verified(sink: tuple[str, Path]) -> None:
    base, out = sink
    ch = _generic(local.env(base))
    assert ch.deliver(NOTE) == {"status": 204}
    kept = [json.loads(x) for x in out.read_text().splitlines()]
    assert [k["path"] for k in kept] == [local.PATH] and kept[0]["body"]["id"] == NOTE["id"]


def test_a_wrong_key_is_refused_for_good_not_retried(sink: tuple[str, Path]) -> None:
    base, out = sink
    ch = _generic({**local.env(base), "PITSTOP_GENERIC_WEBHOOK_KEY": "not-the-receivers-key"})
    assert ch.deliver(NOTE) == {"rejected": 401}
    assert not out.exists()


def test_an_unsigned_post_is_refused_by_a_receiver_that_checks(sink: tuple[str, Path]) -> None:
    base, _ = sink
    ch = _generic({"PITSTOP_GENERIC_WEBHOOK_URL": base + local.PATH})
    assert ch.key is None and ch.deliver(NOTE) == {"rejected": 401}


def test_a_receiver_that_is_down_makes_notify_retry(sink: tuple[str, Path]) -> None:
    base, out = sink
    urllib.request.urlopen(urllib.request.Request(base + "/_down", data=b"", method="POST"))
    with pytest.raises(RuntimeError, match="generic webhook answered 503"):
        _generic(local.env(base)).deliver(NOTE)
    assert out.with_name("webhook-refused.jsonl").exists()


def test_it_is_configured_only_with_a_url_and_refuses_plain_http_elsewhere() -> None:
    assert all(c.name != "generic_webhook" for c in channels.configured({}))
    with pytest.raises(ValueError, match="must be https"):
        channels.configured({"PITSTOP_GENERIC_WEBHOOK_URL": "http://example.com/hook"})
