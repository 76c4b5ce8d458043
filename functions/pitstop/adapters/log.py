"""Structured logs: one JSON object per line on stdout, which Cloud Logging parses."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit(severity: str, message: str, **fields: Any) -> None:
    record = {"severity": severity, "message": message, "component": "pitstop", **fields}
    sys.stdout.write(json.dumps(record, default=str) + "\n")
    sys.stdout.flush()
