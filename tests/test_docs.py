"""The README and docs/ as a reader meets them: every relative link lands inside the repository
(on a heading that exists, when it names one), the README stays a quickstart (at most 400 lines),
the quickstart's configuration passes deploy's own checks, and the version, changelog and license
agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS]
README_MAX_LINES = 400

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def _prose(text: str) -> str:
    """The text outside code blocks and code spans, where a link is a link."""
    return CODE.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    return [m.group(1) for m in LINK.finditer(_prose(text))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    out: set[str] = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", text), re.M):
        base = slug(m.group(1))
        name, n = base, 0
        while name in out:  # GitHub numbers repeated headings: name, name-1, name-2
            n += 1
            name = f"{base}-{n}"
        out.add(name)
    return out


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``page`` that does not resolve inside ``root``, with why."""
    out = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ... not a path in the repository
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(root):
            out.append(f"{target}: outside the repository")
        elif not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            out.append(f"{target}: no heading #{anchor} in {dest.relative_to(root)}")
    return out


def test_the_link_check_finds_what_is_broken_and_passes_what_is_not(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "cost.md").write_text("# Cost\n\n## What to measure\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/cost.md) [ok](docs/cost.md#what-to-measure) [web](https://example.com/x)\n"
        "[self](#a-title)\n"
        "[gone](docs/nothing.md) [out](../../etc/passwd) [no heading](docs/cost.md#no-such)\n"
        "`[code](not-a-link.md)`\n```\n[fenced](not-a-link-either.md)\n```\n# A title\n"
    )
    assert len(links((tmp_path / "README.md").read_text())) == 7  # none from code
    found = [b.split(":")[0] for b in broken(tmp_path / "README.md", root=tmp_path)]
    assert found == ["docs/nothing.md", "../../etc/passwd", "docs/cost.md#no-such"]


def test_slugs_are_githubs() -> None:
    assert slug("9. Enforce one cluster first") == "9-enforce-one-cluster-first"
    assert slug("What it saves: `pitstop simulate`") == "what-it-saves-pitstop-simulate"
    assert slug("7. The scheduler's pieces: Slurm agent, GKE") == "7-the-schedulers-pieces-slurm-agent-gke"
    assert anchors("# Notes\n## Notes\n") == {"notes", "notes-1"}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    assert not broken(page)


def test_the_readme_is_a_quickstart_not_a_manual() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move depth to docs/"
    top = [ln.split("#")[0].strip() for ln in lines[:8]]
    assert "make demo" in top and "make test" in top  # the two commands, on the first screen


def test_every_doc_is_in_the_index_and_the_index_in_the_readme() -> None:
    index = set(links((ROOT / "docs" / "README.md").read_text()))
    assert {d.name for d in DOCS} - {"README.md"} <= index
    assert "docs/README.md" in links((ROOT / "README.md").read_text()) or "docs/README.md" in links(
        (ROOT / "CHANGELOG.md").read_text()
    )


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def test_the_quickstarts_config_passes_deploys_checks(tmp_path: Path) -> None:
    """The README's deploy.yaml and policy.yaml as a reader copies them: schema and pre-flight clean;
    and its enforce stage, on the same deploy.yaml, is too."""
    from pitstop.tools import deploy, preflight

    readme = (ROOT / "README.md").read_text()
    configs = {
        b.splitlines()[0].lstrip("# ").split()[0]: b for b in _blocks(readme, "yaml") if b.startswith("#")
    }
    assert set(configs) == {"deploy.yaml", "policy.yaml"}
    for name, text in configs.items():
        (tmp_path / name).write_text(text)
    stages = [b for b in _blocks(readme, "yaml") if b.startswith("mode: enforce")]
    assert len(stages) == 1
    for policy in (configs["policy.yaml"], stages[0] + configs["policy.yaml"].split("\n", 2)[2]):
        (tmp_path / "policy.yaml").write_text(policy)
        conf = deploy.load_config(str(tmp_path / "deploy.yaml"))
        conf = {**conf, "policy": str(tmp_path / "policy.yaml")}
        assert preflight.check(conf, "my-project") == []


def test_version_changelog_and_license_agree() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    newest = re.search(r"^## (\d+\.\d+\.\d+)\b", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert newest is not None and newest.group(1) == project["version"]
    assert project["license"] == "Apache-2.0"
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text  # the whole text, not a pointer to it


def test_the_readme_quickstart_shows_yaml_that_parses() -> None:
    for block in _blocks((ROOT / "README.md").read_text(), "yaml"):
        assert isinstance(yaml.safe_load(block), dict)
