"""The sink filter files in infra/filters/: one source of truth for deploy, replay and the local router."""

from __future__ import annotations

import os
from pathlib import Path

SINK_FILTERS = {"pitstop-gpu-xid": "gpu-xid.filter", "pitstop-system-events": "system-events.filter"}


def filters_dir() -> Path:
    env = os.environ.get("PITSTOP_FILTERS")
    package = Path(__file__).resolve().parents[1]  # pitstop/: staged copies sit inside it
    for c in ([Path(env)] if env else []) + [package / "filters", package.parents[1] / "infra" / "filters"]:
        if (c / "gpu-xid.filter").is_file():
            return c
    raise FileNotFoundError("infra/filters not found")


def read_filter(name: str, directory: Path | None = None) -> str:
    """A filter file as one line (whitespace folded), as gcloud and the API receive it."""
    text = ((directory or filters_dir()) / name).read_text(encoding="utf-8")
    return " ".join(text.split())


def sink_filters(directory: Path | None = None) -> dict[str, str]:
    return {sink: read_filter(f, directory) for sink, f in SINK_FILTERS.items()}


def plugin_filters(directory: Path | None = None) -> dict[str, str]:
    """The log sinks a plugin folder adds when its configuration asks (its manifest's deploy
    fragment, ``resources.sinks`` of kind ``log-sink``: Vertex AI's ``pitstop-vertex-jobs``)."""
    from pitstop.core import plugins

    out: dict[str, str] = {}
    for p in plugins.all_plugins():
        sinks = (p.deploy.get("resources") or {}).get("sinks") or []
        for s in sinks:
            if s.get("kind") == "log-sink" and s.get("filter_file"):
                out[str(s["name"])] = read_filter(str(s["filter_file"]), directory)
    return out


def combined_filter(directory: Path | None = None) -> str:
    return " OR ".join(f"({f})" for f in sink_filters(directory).values())
