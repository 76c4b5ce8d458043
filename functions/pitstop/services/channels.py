"""The channels notify delivers to: every channel folder of plugins/channels/ the environment
configures (deploy sets it, secrets from Secret Manager), in the folders' order. There is no table
here to edit: a channel is one folder."""

from __future__ import annotations

from collections.abc import Mapping

from pitstop.adapters.http import post_bytes, post_json
from pitstop.plugins import modules
from pitstop.plugins.channels import Build, Channel, Http, Post, PostBytes

__all__ = ["Channel", "Http", "Post", "builders", "configured"]


def builders() -> dict[str, Build]:
    """Each channel folder's name and how its configuration is read."""
    return {plugin.name: module.build for plugin, module in modules("channels")}


def configured(
    env: Mapping[str, str], post: Post = post_json, post_raw: PostBytes = post_bytes
) -> list[Channel]:
    """Every channel the environment configures, in the folders' order."""
    http = Http(post, post_raw)
    return [ch for build in builders().values() if (ch := build(env, http)) is not None]
