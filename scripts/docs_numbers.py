"""Render the numbers of the docs from what the tree says and what was measured: never typed by hand.

    python scripts/docs_numbers.py            # read the inputs from the tree again, then render every block
    python scripts/docs_numbers.py --render   # only render the blocks from docs/docs_numbers.json
    python scripts/docs_numbers.py --stale    # name the inputs that no longer match the tree (exit 1 if any)

A block is the text between ``<!-- docs-numbers NAME -->`` and ``<!-- /docs-numbers -->`` in
README.md or a page of docs/ (not docs/dev/); NAME is one of :data:`RENDERERS`. Each is rendered from
``docs/docs_numbers.json``, which holds two kinds of numbers:

* ``inputs``: read from the tree, cheaply (the check's properties and defaults, the verified toggle
  code, the claimed Python and torch versions, the workflow's matrix, the planted bugs, the migrate
  corpus list), plus the test count of ``docs/readme_numbers.json`` (``scripts/readme_numbers.py
  --count`` collects it, and renders these blocks too);
* ``measured``: what a slow script measured, with the commit it ran at: written there by
  ``scripts/torch_matrix.py`` (``table``, the torch x Lightning matrix) and ``scripts/mutation_score.py`` (a
  full run) when they run again; copied from the reports of ``scripts/lightning_suite.py`` and
  ``scripts/migrate_corpus.py``, with the commit they name (both need third-party code that is not in
  the repository: a Lightning checkout, the corpus's files). A block says what a record covers and
  what it does not (planted bugs added since, a check that has gained properties).

``tests/test_docs.py`` fails when a block is not the rendering of the file, or when an input is stale
(the file's differs from the tree's): run this script, and the pages say what is true again.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "docs_numbers.json"
README_NUMBERS = ROOT / "docs" / "readme_numbers.json"
BLOCK = re.compile(r"(<!-- docs-numbers (?P<name>[\w-]+) -->\n?)(?P<body>.*?)(\n?<!-- /docs-numbers -->)", re.DOTALL)


def pages() -> list[Path]:
    """The pages a user reads: README.md and docs/*.md (docs/dev/ is the maintainers')."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


# -- the inputs, read from the tree --------------------------------------------------------------


def _noxfile_versions() -> list[str]:
    for node in ast.parse((ROOT / "noxfile.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "LIGHTNING_VERSIONS" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise SystemExit("noxfile.py defines no LIGHTNING_VERSIONS")


def claims() -> dict[str, Any]:
    """What pyproject.toml claims: Python (requires-python and the classifiers), the torch floor, and
    the Lightning releases of the matrix (noxfile.py)."""
    text = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'^requires-python = ">=(\d+\.\d+)"', text, re.MULTILINE)
    torch = re.search(r'"torch>=([\d.]+)"', text)
    if not floor or not torch:
        raise SystemExit("pyproject.toml: no requires-python or torch floor")
    pythons = re.findall(r'"Programming Language :: Python :: (3\.\d+)"', text)
    lightning = re.search(r'^lightning = \["lightning>=([\d.]+)', text, re.MULTILINE)
    if not lightning:
        raise SystemExit("pyproject.toml: no lightning extra")
    return {"requires_python": floor.group(1), "pythons": pythons, "torch": torch.group(1),
            "lightning_floor": lightning.group(1), "lightning": _noxfile_versions()}


def profiles() -> dict[str, int]:
    """The Hypothesis profiles of the root conftest.py: name -> examples a property."""
    found = {}
    for node in ast.walk(ast.parse((ROOT / "conftest.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "register_profile":
            examples = next(k.value for k in node.keywords if k.arg == "max_examples")
            found[ast.literal_eval(node.args[0])] = ast.literal_eval(examples)
    return found


def ci_matrix() -> dict[str, Any]:
    """The GitHub workflow's test matrix, expanded as GitHub expands it (tests/test_workflow.py's rule)."""
    import yaml  # Lightning requires PyYAML; only this input needs it

    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from test_workflow import _expand
    finally:
        sys.path.pop(0)
    matrix = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())["jobs"]["tests"]["strategy"][
        "matrix"]  # fmt: skip
    rows = _expand(matrix)
    torch: dict[str, list[str]] = {}
    for row in rows:
        torch.setdefault(row["python"], [])
        if row["torch"] not in torch[row["python"]]:
            torch[row["python"]].append(row["torch"])
    excluded = [f"Python {e['python']} with {e['flavour']} {e['lightning']}" for e in matrix.get("exclude", [])]
    return {"jobs": len(rows), "pythons": matrix["python"], "lightning": matrix["lightning"],
            "flavours": matrix["flavour"], "torch": {py: sorted(v, key=_version) for py, v in torch.items()},
            "excluded": excluded}


def check() -> dict[str, Any]:
    """``python -m toggleshim check``: its properties with their hand-picked worlds, its defaults."""
    from toggleshim import __main__ as cli
    from toggleshim import _certify

    return {
        "choices": _certify.choices_sentence("lightning", "(unverified)"),
        "properties": [[p.name, p.doc, len(p.hand_picked()), p.random(100)] for p in cli.PROPERTIES],
        "examples": cli._parser("toggleshim").parse_args(["check"]).examples,
        "certify_examples": cli.CERTIFY_EXAMPLES,
        "max_lines": cli.MAX_LINES,
    }


def known() -> dict[str, Any]:
    from toggleshim._known import KNOWN

    return {"code": [[a, b, releases] for (a, b), releases in KNOWN.items()], "matrix": _noxfile_versions()}


def mutants() -> list[str]:
    """The planted bugs of ``toggleshim/testing/mutants.py`` (Lightning releases, then shim bugs)."""
    from toggleshim.testing import mutants as m

    return [*m.LIGHTNING, *m.SHIM]


def corpus() -> dict[str, int]:
    lines = [line.split() for line in (ROOT / "scripts" / "migrate_corpus.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return {"files": len(lines), "repositories": len({line[0] for line in lines})}


def tree_inputs() -> dict[str, Any]:
    """Every input, as the tree has it now."""
    tests = json.loads(README_NUMBERS.read_text())["tests"]
    return {"claims": claims(), "ci": ci_matrix(), "check": check(), "known": known(), "mutants": mutants(),
            "corpus": corpus(), "profiles": profiles(), "tests": tests}


def stale(data: dict[str, Any]) -> list[str]:
    """The inputs of ``data`` that differ from the tree's (by name)."""
    now = tree_inputs()
    return [key for key in now if data.get("inputs", {}).get(key) != now[key]]


# -- the blocks ---------------------------------------------------------------------------------


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def _span(versions: list[str]) -> str:
    ordered = sorted(versions, key=_version)
    return ordered[0] if len(ordered) == 1 else f"{ordered[0]}\N{EN DASH}{ordered[-1]}"


def render_claims(data: dict[str, Any]) -> str:
    """What pyproject claims, then exactly which of it ran here and passed (the matrix's last run)."""
    c = data["inputs"]["claims"]
    rows = data["measured"]["matrix"]["rows"]
    passed = [r for r in rows if r["result"] == "pass"]
    by_lightning: dict[str, list[str]] = {}
    for r in sorted(passed, key=lambda r: (_version(r["lightning"]), _version(r["torch"]))):
        by_lightning.setdefault(r["lightning"], []).append(r["torch"])
    named = "; ".join(f"Lightning {lightning} with torch {', '.join(torches)}"
                      for lightning, torches in by_lightning.items())
    others = len(rows) - len(passed)
    rest = (f"the other {others} cell{'s' if others != 1 else ''} of the matrix: not verified here" if others
            else f"that is every cell of the matrix ({len(rows)})")
    return (f"Python {_span(c['pythons'])}, torch ≥ {c['torch']}, Lightning {', '.join(c['lightning'])} in both "
            f"flavours; passed here (suite and `check`, Python 3.11): {named or 'none yet'}; {rest}")


def render_needs(data: dict[str, Any]) -> str:
    c = data["inputs"]["claims"]
    return f"Python ≥ {c['requires_python']}, torch ≥ {c['torch']} and Lightning ≥ {c['lightning_floor']}"


def render_ci_examples(data: dict[str, Any]) -> str:
    p = data["inputs"]["profiles"]
    return f"{p['ci'] / p['dev']:g}\N{MULTIPLICATION SIGN} the examples"


def render_max_lines(data: dict[str, Any]) -> str:
    return f"within {data['inputs']['check']['max_lines']} lines"


def render_ci(data: dict[str, Any]) -> str:
    ci = data["inputs"]["ci"]
    torch = "; ".join(f"Python {py}: {', '.join(v[:-1])} and {v[-1]}" for py, v in ci["torch"].items())
    excluded = f" (without {'; '.join(ci['excluded'])})" if ci["excluded"] else ""
    times = " \N{MULTIPLICATION SIGN} "
    return (f"{ci['jobs']} jobs: Python {', '.join(ci['pythons'])}{times}Lightning {', '.join(ci['lightning'])}{times}"
            f"{' and '.join(ci['flavours'])}{excluded}{times}the oldest and the newest torch each row allows "
            f"({torch}).")


def render_known(data: dict[str, Any]) -> str:
    codes = []
    for a, b, releases in data["inputs"]["known"]["code"]:
        dists = sorted({r.split()[0] for r in releases})
        versions = sorted({r.split()[1] for r in releases}, key=_version)
        codes.append(f"fingerprints `{a[:12]}…`, `{b[:12]}…`, in {len(releases)} releases: "
                     f"{' and '.join(f'`{d}`' for d in dists)} {', '.join(versions)}")
    count = "one toggle code" if len(codes) == 1 else f"{len(codes)} toggle codes"
    return f"Verified by this toggleshim: {count} ({'; '.join(codes)})."


def render_check(data: dict[str, Any]) -> str:
    c = data["inputs"]["check"]
    rows = [f"| `{name}` | {doc} | {hand} | {random} |" for name, doc, hand, random in c["properties"]]
    return "\n".join([
        "| property | what it checks | hand-picked worlds | random worlds (default) |",
        "| --- | --- | ---: | ---: |",
        *rows,
        "",
        f"`--examples N` sets the random worlds a property ({c['examples']} by default; the `Trainer.fit` "
        f"properties run a tenth, at least one). A report stays within {c['max_lines']} lines.",
    ])


def render_choices(data: dict[str, Any]) -> str:
    return "> " + data["inputs"]["check"]["choices"]


def render_certify(data: dict[str, Any]) -> str:
    n = data["inputs"]["check"]["certify_examples"]
    return (f"It runs every property of `check`, with {n} random worlds a property by default, on each installed "
            "flavour whose code is not verified.")


def render_tests(data: dict[str, Any]) -> str:
    return f"{data['inputs']['tests']} tests"


def render_mutation(data: dict[str, Any]) -> str:
    m, now = data["measured"]["mutation_score"], data["inputs"]["mutants"]
    run = set(m["mutants"])
    new = [name for name in now if name not in run]
    gone = [name for name in m["mutants"] if name not in now]
    text = (f"{m['caught']} of the {len(m['mutants'])} planted bugs caught, the unaltered code passing "
            f"(`python scripts/mutation_score.py --kind all`, commit {m['commit']}, {m['cores']} cores)")
    if new:
        text += f"; planted since, not run yet: {len(new)} of today's {len(now)} ({', '.join(new)})"
    if gone:
        text += f"; since removed: {', '.join(gone)}"
    return text + "."


def render_lightning_suite(data: dict[str, Any]) -> str:
    s = data["measured"]["lightning_suite"]
    return (f"Lightning's own tests (tag {s['tag']}) give the same results with and without the shim: the toggle "
            f"and manual-optimization selection {s['selection']} in both modes (commit {s['commit']}; "
            f"{s['selection_note']}), the broad selection {s['broad']} in both modes ({s['broad_note']}).")


def render_corpus(data: dict[str, Any]) -> str:
    c, listed = data["measured"]["migrate_corpus"], data["inputs"]["corpus"]
    text = (f"On {c['files']} public LightningModule files from {c['repositories']} repositories (every statement "
            f"toggle in them: {c['toggles']}), the default rules rewrite {c['rewritten']} spans and refuse "
            f"{c['refused']}, each correctly by the rules; with both assumptions {c['clean_both']} of the "
            f"{c['toggles']} reach the plain block. There and back, all {c['back']} blocks go back into Lightning's "
            f"statements and no file keeps `toggleshim` (`scripts/migrate_corpus.py`, commit {c['commit']})")
    if (listed["files"], listed["repositories"]) != (c["files"], c["repositories"]):
        text += (f"; the list now names {listed['files']} files from {listed['repositories']} repositories, "
                 "not measured yet")
    return text + "."


def render_matrix(data: dict[str, Any]) -> str:
    """The torch x Lightning matrix's last run of every cell (``scripts/torch_matrix.py table``)."""
    m = data["measured"]["matrix"]
    rows = m["rows"]
    ran = [r for r in rows if r["result"] != "not run"]
    pythons = sorted({r["python"] for r in ran}, key=_version)
    commits = sorted({r["commit"] for r in ran})
    elsewhere = [py for py in data["inputs"]["ci"]["pythons"] if not any(p.startswith(py + ".") for p in pythons)]
    props_now = sorted(p[0] for p in data["inputs"]["check"]["properties"])
    older = [r for r in ran if r["check_properties"] and r["check_properties"] != props_now]
    how_many = f"all {len(rows)}" if len(ran) == len(rows) else f"{len(ran)} of the {len(rows)}"
    lines = [
        (f"Run here on Python {', '.join(pythons)} only, {how_many} cells, by {m['produced_by']}, "
         f"at commit {', '.join(commits)} (table of {m['generated']}).") if ran else
        (f"None of the {len(rows)} cells has run yet ({m['produced_by']}; table of {m['generated']})."),
    ]
    if elsewhere:
        lines[0] += f" Python {', '.join(elsewhere)}: only in the GitHub workflow (above), not verified here."
    if older:
        lines[0] += (f" In {len(older)} rows `check` ran other properties than today's {len(props_now)}: these rows "
                     "predate the current check and suite, and `scripts/torch_matrix.py run` runs them again.")
    lines += [
        "",
        "| torch | Lightning (both distributions) | tests: passed / failed / errors / skipped | check | result "
        "| commit |",
        "| --- | --- | --- | --- | --- | --- |",
    ]  # (each row's Python, date and minutes are in docs_numbers.json)
    lines += [f"| {r['torch']} | {r['lightning']} | {r['tests']} | {r['check'].replace('|', '/')} | {r['result']} "
              f"| {r['commit']} |" for r in rows]
    return "\n".join(lines)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "claims": render_claims,
    "needs": render_needs,
    "ci-examples": render_ci_examples,
    "max-lines": render_max_lines,
    "ci": render_ci,
    "known": render_known,
    "check": render_check,
    "certify": render_certify,
    "choices": render_choices,
    "tests": render_tests,
    "mutation": render_mutation,
    "lightning-suite": render_lightning_suite,
    "corpus": render_corpus,
    "matrix": render_matrix,
}


def rendered(text: str, data: dict[str, Any]) -> str:
    """``text`` with every block rendered from ``data`` (an unknown block name is an error)."""

    def one(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in RENDERERS:
            raise SystemExit(f"unknown docs-numbers block {name!r}; known: {', '.join(RENDERERS)}")
        body = RENDERERS[name](data)
        newline = "\n" in match.group(1)
        return f"{match.group(1)}{body}{chr(10) if newline else ''}<!-- /docs-numbers -->"

    return BLOCK.sub(one, text)


def render_all(data: dict[str, Any] | None = None) -> list[Path]:
    """Render every block of every page; the pages changed."""
    data = data if data is not None else json.loads(DATA.read_text())
    changed = []
    for page in pages():
        text = page.read_text()
        new = rendered(text, data)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--render", action="store_true", help="only render the blocks from the JSON")
    parser.add_argument("--stale", action="store_true", help="name the stale inputs (exit 1 if any)")
    args = parser.parse_args(argv)
    data = json.loads(DATA.read_text())
    if args.stale:
        found = stale(data)
        print("stale: " + ", ".join(found) if found else "no input is stale")
        return 1 if found else 0
    if not args.render:
        data["inputs"] = tree_inputs()
        DATA.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    for page in render_all(data):
        print(f"rendered {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
