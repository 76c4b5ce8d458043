"""`make agent-wheel`: the Slurm agent alone as a wheel, for a controller's /opt/pitstop venv.

The package ``pitstop`` is the functions, the operator CLI and the local stack, with their
dependencies (Kubernetes, Vertex AI, Firestore...); a Slurm controller needs none of that. This
wheel, ``pitstop-slurm-agent``, holds pitstop/agent and the modules it imports (found by reading
its import statements, those inside functions too), and requires only what they import.

It is written directly in the binary distribution format (packaging.python.org/specifications/
binary-distribution-format/: the files, then ``*.dist-info`` with METADATA, WHEEL,
entry_points.txt and RECORD, each file's sha256 and size), so building needs no build backend
and no network. Byte for byte the same for the same source (fixed timestamps, sorted entries).
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import sys
import tomllib
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "functions"
NAME = "pitstop-slurm-agent"
ENTRY = "pitstop.agent.slurm.cli:main"
# What the agent's modules import from outside the standard library (tests/tools/test_agent_wheel.py
# checks the list against the imports), with pyproject.toml's version floors.
REQUIRES = ("google-cloud-pubsub", "typing-extensions")
STAMP = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can carry: a reproducible wheel


def _imports(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` of the file names (absolute imports only)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def _file(module: str) -> Path | None:
    """The source file of a ``pitstop`` module or package under functions/ (None: not a module)."""
    base = SOURCE.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def closure() -> tuple[list[Path], set[str]]:
    """Every file of pitstop/agent and of what it imports from pitstop (with each package's
    __init__ up to pitstop), and the top-level names of what they import from outside pitstop."""
    files: set[Path] = set()
    outside: set[str] = set()
    todo = [
        ".".join(p.relative_to(SOURCE).with_suffix("").parts).removesuffix(".__init__")
        for p in (SOURCE / "pitstop" / "agent").rglob("*.py")
    ]
    while todo:
        module = todo.pop()
        parts = module.split(".")
        if parts[0] != "pitstop":
            outside.add(parts[0])
            continue
        for i in range(1, len(parts) + 1):  # the module and every package above it
            path = _file(".".join(parts[:i]))
            if path is not None and path not in files:
                files.add(path)
                todo += sorted(_imports(path))
    return sorted(files), outside - set(sys.stdlib_module_names) - {"__future__"}


def _requires() -> list[str]:
    """REQUIRES with pyproject.toml's floors (one place says which versions work)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {d.split(">=")[0].strip(): d for d in deps}
    return [floors.get(name, name) for name in REQUIRES]


def _version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _metadata(version: str) -> bytes:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {version}",
        "Summary: Pitstop's Slurm agent: runs Pitstop's drain/resume/requeue/check commands on a controller",
        "License: Apache-2.0",
        "Requires-Python: >=3.11",
        *(f"Requires-Dist: {r}" for r in _requires()),
    ]
    return ("\n".join(lines) + "\n").encode()


def _dist_info(version: str) -> dict[str, bytes]:
    return {
        "METADATA": _metadata(version),
        "WHEEL": b"Wheel-Version: 1.0\nGenerator: pitstop.tools.agent_wheel\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
        "entry_points.txt": f"[console_scripts]\n{NAME} = {ENTRY}\n".encode(),
        "LICENSE": (ROOT / "LICENSE").read_bytes(),
    }


def _write(path: Path, entries: Iterable[tuple[str, bytes]], record: str) -> None:
    lines = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        for name, data in entries:
            whl.writestr(zipfile.ZipInfo(name, STAMP), data, zipfile.ZIP_DEFLATED)
            lines.append(_record_line(name, data))
        lines.append(f"{record},,")  # RECORD lists itself without a hash
        whl.writestr(zipfile.ZipInfo(record, STAMP), "\n".join(lines) + "\n", zipfile.ZIP_DEFLATED)


def build(out: Path) -> Path:
    """Write the wheel into ``out``; its path."""
    version = _version()
    files, _ = closure()
    info = f"{NAME.replace('-', '_')}-{version}.dist-info"
    entries = [(p.relative_to(SOURCE).as_posix(), p.read_bytes()) for p in files]
    entries += [(f"{info}/{k}", v) for k, v in _dist_info(version).items()]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{NAME.replace('-', '_')}-{version}-py3-none-any.whl"
    _write(path, entries, f"{info}/RECORD")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pitstop.tools.agent_wheel", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--out", default=str(ROOT / "dist"), help="directory the wheel is written to (default: dist/)"
    )
    print(build(Path(p.parse_args(argv).out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
