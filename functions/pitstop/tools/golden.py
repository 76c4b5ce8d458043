"""The deploy baselines in tests/fixtures/deploy/, regenerated from the code and data as they are.

``python -m pitstop.tools.golden [DIR]`` (``make golden``) writes, for every case, the plan
(every field of every step) and the dry-run output, normalised so that only a real change shows:
the ``pitstop_config`` digests (they digest the shipped code, which changes with every edit) become
``<digest>``, and this checkout's path the recorded one. A deploy change is then reviewed as the
diff of these files; tests/tools/test_deploy_plan.py fails while they are stale.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pitstop.tools import deploy

BASELINE_ROOT, BASELINE_TMP = "/work/main", "/tmp"  # noqa: S108 - the paths the baselines name
CASES = (  # name, --project, --region, --config (relative to the repository)
    ("default", "demo-proj", None, None),
    ("slurm-folder", "demo-proj", None, "tests/fixtures/deploy/slurm-folder.yaml"),
    ("org", "p-2", "asia-southeast1", "tests/fixtures/deploy/org.yaml"),
    ("channels", "demo-proj", None, "tests/fixtures/deploy/channels.yaml"),
    ("gke", "demo-proj", None, "tests/fixtures/deploy/gke.yaml"),
    ("pagerduty", "demo-proj", None, "tests/fixtures/deploy/pagerduty.yaml"),
    ("vertex", "demo-proj", None, "tests/fixtures/deploy/vertex.yaml"),
)
DEFAULT_DIR = deploy.ROOT / "tests" / "fixtures" / "deploy"


def normalised(text: str) -> str:
    """Digest labels (and the expect values equal to them) as a token; paths as recorded."""
    for digest in set(re.findall(r"pitstop_config=([0-9a-f]+)", text)):
        text = text.replace(f'"{digest}"', '"<digest>"')  # a step's expect: the label it checks for
    text = re.sub(r"pitstop_config=[0-9a-f]+", "pitstop_config=<digest>", text)
    metric = "pitstop-xid-metric.json"
    text = text.replace(str(Path(tempfile.gettempdir()) / metric), f"{BASELINE_TMP}/{metric}")
    return text.replace(str(deploy.ROOT), BASELINE_ROOT)


def case_files(name: str, project: str, region: str | None, config: str | None) -> dict[str, str]:
    """The two baselines of one case: ``<name>.plan.json`` and ``<name>.dry-run.txt``."""
    conf = deploy.load_config(config)
    where = region or deploy.setting(conf, "region")
    steps = deploy.plan(project, where, conf)
    plan = json.dumps([dataclasses.asdict(s) for s in steps], indent=1, sort_keys=True) + "\n"
    dry = "".join(f"{line}\n" for line in deploy.dry_run_lines(project, where, conf))
    return {f"{name}.plan.json": normalised(plan), f"{name}.dry-run.txt": normalised(dry)}


def write(directory: Path) -> list[Path]:
    """Write every case's baselines into ``directory``; the files written."""
    here = Path.cwd()
    os.chdir(deploy.ROOT)  # the cases name their configs relative to the repository
    try:
        out = []
        for case in CASES:
            for fname, text in case_files(*case).items():
                path = directory / fname
                path.write_text(text)
                out.append(path)
        return out
    finally:
        os.chdir(here)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    directory = Path(args[0]) if args else DEFAULT_DIR
    for path in write(directory):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
