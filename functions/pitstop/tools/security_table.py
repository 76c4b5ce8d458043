"""docs/security.md's table of inputs, generated from the threat model (schemas/inputs.yaml).

``python -m pitstop.tools.security_table`` rewrites the table between its markers in
docs/security.md; tests/test_inputs.py fails while the file and the model disagree.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pitstop.core import inputs

DOC = Path(__file__).resolve().parents[3] / "docs" / "security.md"
BEGIN = "<!-- inputs table: generated from schemas/inputs.yaml by python -m pitstop.tools.security_table -->"
END = "<!-- end of the inputs table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _writers(inp: inputs.Input) -> str:
    return ", ".join(f"`{w['permission']}` ({w['scope']})" for w in inp["writes"])


def _gated(inp: inputs.Input) -> str:
    if not inp["leads_to"]:
        return {
            "hint": "nothing",
            "evidence": "evidence: confirms, never acts",
            "control": "Pitstop's own channel: its writer acts as Pitstop (keep it to Pitstop's accounts)",
        }[inp["kind"]]
    return "; ".join(
        f"{', '.join(g['actions'])} only with {' + '.join(f'[{x}](#gates)' for x in g['gates'])}"
        for g in inp["leads_to"]
    )


def table(model: inputs.Model) -> str:
    """The markdown table: one row per input, then the gates it names."""
    rows = [
        "| input | what | who can write it | alone, at most | disruptive actions it can lead to |",
        "|---|---|---|---|---|",
    ]
    for inp in model["inputs"]:
        what = inp["what"] + (" (planned)" if inp.get("status") == "planned" else "")
        cells = [f"`{inp['id']}`", _cell(what), _cell(_writers(inp)), inp["alone"], _cell(_gated(inp))]
        rows.append(f"| {' | '.join(cells)} |")
    gates = [f"- **{name}**: {_cell(text)}" for name, text in model["gates"].items()]
    return "\n".join([*rows, "", "### Gates", "", *gates])


def rendered(doc: str, model: inputs.Model) -> str:
    """``doc`` with the table between its markers replaced by the model's."""
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{table(model)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    path = Path((argv or sys.argv[1:] or [str(DOC)])[0])
    path.write_text(rendered(path.read_text(), inputs.model()))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
