"""Channels and schedulers, one folder each (core/plugins.py reads their manifests; the registries
in services/channels.py and services/schedulers.py import their code)."""

from __future__ import annotations

import importlib
from types import ModuleType

from pitstop.core import plugins as data


def modules(kind: data.Kind) -> list[tuple[data.Plugin, ModuleType]]:
    """Each plugin of a kind with its code, in the manifests' order."""
    return [(p, importlib.import_module(p.module)) for p in data.found(kind)]
