"""The docs a user reads (README.md and docs/*.md; docs/dev/ is the maintainers'): read in one sitting,
their numbers rendered by scripts/docs_numbers.py from the tree and the recorded measurements, their
links, references and names real."""

from __future__ import annotations

import ast
import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _doc_names import problems
from test_readme import _anchors

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import docs_numbers
finally:
    sys.path.pop(0)

USER_PAGES = docs_numbers.pages()
ALL_PAGES = [*USER_PAGES, *sorted((ROOT / "docs" / "dev").glob("*.md"))]
MAX_WORDS = 12_000  # README.md and docs/*.md together: what a person reads in one sitting


def _data() -> dict[str, Any]:
    return json.loads(docs_numbers.DATA.read_text())  # type: ignore[no-any-return]


def test_the_user_docs_are_read_in_one_sitting() -> None:
    words = {p.name: len(p.read_text().split()) for p in USER_PAGES}
    assert len(words) >= 8 and "README.md" in words
    assert sum(words.values()) <= MAX_WORDS, f"{sum(words.values())} words: {words}"


# the numbers


def test_every_numbers_block_is_the_scripts_rendering() -> None:
    data, names = _data(), []
    for page in USER_PAGES:
        text = page.read_text()
        names += [m["name"] for m in docs_numbers.BLOCK.finditer(text)]
        assert docs_numbers.rendered(text, data) == text, f"{page.name}: run python scripts/docs_numbers.py --render"
    assert set(names) == set(docs_numbers.RENDERERS), "a renderer no page uses, or a block no renderer renders"


def test_no_input_of_the_numbers_is_stale() -> None:
    stale = docs_numbers.stale(_data())
    assert stale == [], f"stale inputs: {', '.join(stale)}; run: python scripts/docs_numbers.py"


def test_a_stale_input_is_seen_and_the_page_says_what_a_record_does_not_cover() -> None:
    """The control: an input the tree no longer has is stale; a record older than the tree's planted bugs,
    or than its check, is rendered as such."""
    data = _data()
    changed = copy.deepcopy(data)
    changed["inputs"]["mutants"] = changed["inputs"]["mutants"][:-1]
    changed["inputs"]["check"]["examples"] += 1
    assert docs_numbers.stale(changed) == ["check", "mutants"]
    record = changed["measured"]["mutation_score"]
    record["mutants"], record["caught"] = data["inputs"]["mutants"][:-2], len(data["inputs"]["mutants"]) - 2
    assert "planted since, not run yet: 1 of today's" in docs_numbers.render_mutation(changed)
    props = sorted(p[0] for p in data["inputs"]["check"]["properties"])
    changed["measured"]["matrix"]["rows"] = [
        {"torch": "2.1.2", "lightning": "2.6.6", "python": "3.11.7", "tests": "1 / 0 / 0 / 0", "check": "ok",
         "check_properties": props, "result": "pass", "commit": "abc1234", "date": "", "minutes": 1.0}]
    assert "these rows predate the current check" not in docs_numbers.render_matrix(changed)
    changed["inputs"]["check"]["properties"].append(["new", "a new property", 0, 100])
    assert "these rows predate the current check" in docs_numbers.render_matrix(changed)


def test_the_claims_are_what_pyproject_says() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    claims = docs_numbers.claims()
    assert claims["requires_python"] == claims["pythons"][0] and len(claims["pythons"]) >= 2
    assert f'"torch>={claims["torch"]}"' in text
    rendered = docs_numbers.render_claims(_data())
    assert rendered.startswith(
        f"Python {claims['pythons'][0]}\N{EN DASH}{claims['pythons'][-1]}, torch \N{GREATER-THAN OR EQUAL TO} "
        f"{claims['torch']}")
    # and exactly the matrix's passing cells are named as run here (a failing one, or one not run, never)
    groups = dict(re.findall(r"Lightning (\S+) with torch ([^;]+)", rendered))
    for row in _data()["measured"]["matrix"]["rows"]:
        named = row["torch"] in groups.get(row["lightning"], "").split(", ")
        assert named == (row["result"] == "pass"), row


def test_the_claims_say_how_many_cells_did_not_pass() -> None:
    data = copy.deepcopy(_data())
    rows = data["measured"]["matrix"]["rows"]
    for k, row in enumerate(rows):
        row["result"] = "pass" if k else "not run"
    assert docs_numbers.render_claims(data).endswith("; the other 1 cell of the matrix: not verified here")
    rows[0]["result"] = "pass"
    assert docs_numbers.render_claims(data).endswith(f"; that is every cell of the matrix ({len(rows)})")
    rows[0]["result"] = rows[1]["result"] = "fail"
    assert docs_numbers.render_claims(data).endswith("; the other 2 cells of the matrix: not verified here")


def test_docs_numbers_runs_as_a_command() -> None:
    proc = subprocess.run([sys.executable, "scripts/docs_numbers.py", "--stale"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert (proc.returncode, proc.stdout) == (0, "no input is stale\n"), proc.stdout + proc.stderr


# links, references and names


def _links(markdown: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", markdown) if not re.match(r"[a-z]+://|mailto:", t)]


@pytest.mark.parametrize("page", ALL_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_down_to_its_anchor(page: Path) -> None:
    for link in _links(page.read_text()):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name} links {link}: no such file"
        if anchor:
            assert anchor in _anchors(target.read_text()), f"{page.name} links {link}: no such heading"


REFERENCE = re.compile(r'\bdocs/((?:dev/)?[\w.-]+\.md)(?:, "([^"]+)")?')


def _package_strings() -> list[tuple[str, str]]:
    """The strings of the package's code (messages, docstrings; not comments): (file, text)."""
    found = []
    for path in sorted((ROOT / "toggleshim").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.append((str(path.relative_to(ROOT)), node.value))
    return found


def _texts() -> list[tuple[str, str]]:
    """The package's strings and every other tracked text file but the changelog (a history)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    texts = _package_strings()
    for name in files:
        if name.startswith("toggleshim/") or name == "CHANGELOG.md" or not (ROOT / name).is_file():
            continue
        if Path(name).suffix in {".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".in"} or name == ".ci/run":
            texts.append((name, (ROOT / name).read_text(errors="replace")))
    return texts


def test_every_reference_to_a_page_and_its_section_resolves() -> None:
    """``docs/guard.md``, ``docs/migrate.md, "Overrides"`` (a heading that starts so), wherever the code,
    the tests, the scripts or the docs send a reader (the package's comments aside)."""
    checked, broken = 0, []
    for where, text in _texts():
        for match in REFERENCE.finditer(text):
            page, section = ROOT / "docs" / match[1], match[2]
            checked += 1
            if not page.exists():
                broken.append(f"{where}: {match[0]}: no such page")
            elif section and not re.search(rf"^#+ {re.escape(section)}", page.read_text(), re.MULTILINE):
                broken.append(f"{where}: {match[0]}: no such section")
    assert checked > 30
    assert broken == [], "\n".join(broken)


@pytest.mark.parametrize("page", [p for p in USER_PAGES if p.name != "architecture.md"], ids=lambda p: p.name)
def test_every_user_page_names_only_what_exists(page: Path) -> None:
    """Package names, modules, paths and tests a page names exist (docs/architecture.md:
    tests/test_architecture.py)."""
    found = problems(page.read_text())
    assert found == [], f"{page.name} names what the tree does not have:\n" + "\n".join(found)
