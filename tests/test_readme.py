"""The README as users read it: short, its paths and links real, its two commands the ones CI runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
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


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings (lowercased; punctuation but ``-`` and ``_``
    dropped; spaces become ``-``)."""
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
            for title in re.findall(r"^#+ (.*)$", markdown, re.MULTILINE)}


def test_readme_links_and_paths_exist() -> None:
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", README) if not re.match(r"[a-z]+://|#", t)]
    paths = [m.group(1) for m in REPO_PATH.finditer(README)]
    for text in (*links, *paths):
        for path in text.split():
            path, _, anchor = path.partition("#")
            assert (ROOT / path).exists(), f"README names {path}, which does not exist"
            if anchor:
                assert anchor in _anchors((ROOT / path).read_text()), f"README names {path}#{anchor}: no such heading"
    assert links and paths


def test_the_anchor_rule_is_githubs() -> None:
    assert _anchors("## Spawned processes (`strategy=\"ddp_spawn\"`)\n### The module's own methods") == {
        "spawned-processes-strategyddp_spawn", "the-modules-own-methods"}


def test_readme_test_command_is_what_ci_runs() -> None:
    """The README's test command, alone on its line in a bash block, is a command of .ci/run (where
    only environment variables may precede it)."""
    commands = [line.strip() for block in _bash_blocks() for line in block.splitlines()]
    assert "pytest -n auto" in commands
    assert re.search(r"^(?:[A-Z_]+=\S+ )*pytest -n auto$", CI_RUN, re.MULTILINE)


def test_readme_install_command_installs_and_runs_the_check() -> None:
    commands = [line.strip() for block in _bash_blocks() for line in block.splitlines()]
    assert 'pip install -e ".[test,lightning]" && python -m toggleshim check' in commands
    # the user's install names torch first, then the package with a Lightning extra
    install = "\n".join(_bash_blocks())
    assert install.index("pip install torch") < install.index('pip install "toggleshim[lightning]"')


def test_readme_leaves_no_internal_notes() -> None:
    for phrase in ("this project's", "TOGGLESHIM_PURE_PYTHON", "_speedups", "C kernels", "torch==2.13.0"):
        assert phrase not in README, phrase


# every code block runs or type-checks as written


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.DOTALL)


def _excerpt_of(block: str, path: Path) -> bool:
    """``block`` appears, line for line, in the file at ``path`` (indentation included)."""
    return block.strip("\n") in path.read_text()


_TRAIN_README_GAN = """
import sys, torch
sys.path.insert(0, {folder!r})
from readme_gan import GAN
from lightning.pytorch import Trainer
g = torch.Generator().manual_seed(0)
data = [(torch.randn(16, 2, generator=g), torch.randn(16, 8, generator=g)) for _ in range(3)]
module = GAN()
before = [p.detach().clone() for p in module.parameters()]
trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False)
trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=None))
assert trainer.global_step == 6, trainer.global_step  # two optimizer steps a batch
assert all(not torch.equal(a, b) for a, b in zip(before, module.parameters())), "nothing trained"
assert all(p.requires_grad for p in module.parameters()), "left frozen"
print("trained", sorted(trainer.logged_metrics))
"""


def test_the_first_example_is_a_whole_module_that_trains(tmp_path: Path) -> None:
    """As written: pasted into a file, it trains under a real Trainer (after the blocks every
    parameter is trainable again, and it logged both losses)."""
    (tmp_path / "readme_gan.py").write_text(_python_blocks()[0])
    proc = subprocess.run([sys.executable, "-c", _TRAIN_README_GAN.format(folder=str(tmp_path))],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "trained ['d_loss', 'g_loss']" in proc.stdout


_RECIPE = """
import sys, torch
from lightning.pytorch import LightningModule, Trainer
import toggleshim

class Base(LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.net = torch.nn.Linear(2, 1)
    def configure_optimizers(self):
        return torch.optim.SGD(self.net.parameters(), lr=0.1)
    def compute_loss(self, batch):
        return self.net(batch).pow(2).mean()

class Recipe(Base):
{body}
data = [torch.randn(4, 2, generator=torch.Generator().manual_seed(i)) for i in range(8)]
trainer = Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Recipe(), torch.utils.data.DataLoader(data, batch_size=None))
print("steps", trainer.global_step)
"""


def test_the_accumulation_recipe_runs_in_a_module() -> None:
    """The recipe's text, indented into a LightningModule's body, runs under a real Trainer: 8 batches,
    4 micro-batches a step, 2 optimizer steps (its bitwise equality with Lightning's own recipe:
    tests/test_training.py)."""
    recipe = next(b for b in _python_blocks() if "micro-batches" in b)
    body = "\n".join("    " + line if line else line for line in recipe.splitlines())
    proc = subprocess.run([sys.executable, "-c", _RECIPE.format(body=body)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "steps 2" in proc.stdout


def test_every_other_python_block_is_an_excerpt_of_a_checked_file() -> None:
    """The typed example is an excerpt of the file `.ci/run` type-checks with `mypy --strict`; the
    testing example one of the example test that the suite runs, on the first example's GAN as written."""
    blocks = _python_blocks()
    typed = next(b for b in blocks if "toggle(self, d_opt)" in b)
    testing = next(b for b in blocks if "assert_trains_like_manual" in b)
    gan = blocks[0][blocks[0].index("class GAN"):]
    imports, _, method = typed.partition("\n...\n")  # complete: its import, then an excerpt of the method
    assert imports == "from toggleshim import toggle", imports
    assert all(_excerpt_of(part, ROOT / "tests" / "typing" / "typed_gan.py") for part in (imports, method)), typed
    assert _excerpt_of(testing, ROOT / "examples" / "test_my_training.py"), testing
    assert _excerpt_of(gan, ROOT / "examples" / "test_my_training.py"), gan
    assert "tests/typing/typed_gan.py" in CI_RUN or "typed_gan.py" in CI_RUN
    assert len(blocks) == 4, "a new python block in the README: add it to the tests above"


def test_readme_shell_lines_parse_with_the_real_command_line() -> None:
    """Every `toggleshim …` / `python -m toggleshim …` line of the README is accepted by the parser
    of the command it names (nothing runs)."""
    from toggleshim import __main__ as cli
    from toggleshim import _migrate

    lines = [line.split("#")[0].strip() for block in _bash_blocks() for line in block.splitlines()]
    checked = 0
    for line in lines:
        for cmd in line.split("&&"):
            words = cmd.split()
            if words[:3] == ["python", "-m", "toggleshim"]:
                words = words[2:]
            if words[:1] != ["toggleshim"]:
                continue
            if words[1] == "migrate":
                _migrate._parser().parse_args(words[2:])
            else:
                cli._parser("toggleshim").parse_args(words[1:])
            checked += 1
    assert checked >= 5, checked


def test_nothing_in_the_repository_points_outside_it() -> None:
    """Notes kept beside the repository are for its developers; the product never cites them."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outside = re.compile(r"LIGHTNING_NOTES|STYLE\.md|\.\./shared\b")
    hits = [f for f in files if (ROOT / f).is_file() and f != "tests/test_readme.py"
            and outside.search((ROOT / f).read_text(errors="replace"))]
    assert hits == []


# the README's numbers are measured (scripts/readme_numbers.py), the count is the tree's


def test_readme_numbers_are_the_scripts_and_the_count_is_the_trees() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import readme_numbers
    finally:
        sys.path.pop(0)
    numbers = json.loads((ROOT / "docs" / "readme_numbers.json").read_text())
    assert readme_numbers.render(numbers) in README, "run: python scripts/readme_numbers.py --render"
    assert numbers["tests"] == readme_numbers.collected(), "run: python scripts/readme_numbers.py --count"
