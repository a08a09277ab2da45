"""The README as users read it: short, its paths and links real, its two commands the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CI_RUN = (ROOT / ".ci" / "run").read_text()
# A path into the repository, anywhere in the text (commands included).
REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:tests|property_tests|examples|docs|scripts|benchmarks|constraints|\.ci|\.github)/[\w./-]*\w)"
)


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, re.DOTALL)


def test_readme_is_at_most_200_lines() -> None:
    assert len(README.splitlines()) <= 200


def test_readme_links_and_paths_exist() -> None:
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", README) if not re.match(r"[a-z]+://|#", t)]
    paths = [m.group(1) for m in REPO_PATH.finditer(README)]
    for text in (*links, *paths):
        for path in text.split():
            assert (ROOT / path).exists(), f"README names {path}, which does not exist"
    assert links and paths


def test_readme_test_command_is_what_ci_runs() -> None:
    """The README's test command, alone on its line in a bash block, is a command of .ci/run (where
    only environment variables may precede it)."""
    commands = [line.strip() for block in _bash_blocks() for line in block.splitlines()]
    assert "pytest -n auto" in commands
    assert re.search(r"^(?:[A-Z_]+=\S+ )*pytest -n auto$", CI_RUN, re.MULTILINE)


def test_readme_install_command_installs_and_runs_the_check() -> None:
    commands = [line.strip() for block in _bash_blocks() for line in block.splitlines()]
    assert 'pip install -e ".[dev,lightning]" && python -m toggleshim check' in commands
    # the user's install names torch first, then the package with a Lightning extra
    install = "\n".join(_bash_blocks())
    assert install.index("pip install torch") < install.index('pip install "toggleshim[lightning]"')


def test_readme_leaves_no_internal_notes() -> None:
    for phrase in ("this project's", "TOGGLESHIM_PURE_PYTHON", "_speedups", "C kernels", "torch==2.13.0"):
        assert phrase not in README, phrase
