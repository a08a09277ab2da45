"""16-bit AMP with a gradient scaler that skips steps, and ``ddp_spawn``: real ``Trainer.fit``, CPU only.

AMP (``flavour`` parametrized by ``conftest.py``): Lightning's ``MixedPrecision("16-mixed", "cpu",
scaler=torch.amp.GradScaler("cpu"))`` passed through ``plugins=[...]`` (``precision="16-mixed"`` on
CPU silently becomes bf16, which has no scaler). Some losses are multiplied by 1e30, so their
gradients overflow float16, the scaler skips that optimizer's step and halves its scale: the block
must be Lightning's statement sequence bit for bit, the scale history included. This is the
closest a CPU gets to CUDA AMP.

Spawn: ``strategy="ddp_spawn"`` on two CPU processes (``_spawn_script.py``, a subprocess), block vs
Lightning's sequence on every rank. Then where ``import toggleshim`` may sit: spawned children re-run
only the top level of the main script (as ``__mp_main__``; not at all for a package's
``__main__.py`` run with ``python -m``), so an import inside ``main()`` never runs in them by
itself; the Trainer they unpickle imports toggleshim first (``toggleshim/_spawn.py``), so every place
works, but for a subclass of Trainer (the documented limit). Each case is a user's script in a fresh
process.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import _spawn_script as spawn
import _training_models as M
import pytest
import torch
from _fixtures import marked_flavours
from _training_models import one_thread  # noqa: F401  (an autouse fixture)

from toggleshim.testing import installed_flavours

ROOT = Path(__file__).resolve().parent.parent


# -- bitwise comparison, inf and NaN included ---------------------------------------------------------


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    """``a`` and ``b`` equal, tensors bit for bit (so a NaN gradient equals the same NaN)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        bits_a, bits_b = (t.detach().reshape(-1).contiguous().view(torch.uint8) for t in (a, b))
        assert torch.equal(bits_a, bits_b), f"not bit-identical: {where}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


# -- 16-bit AMP with skipped steps ----------------------------------------------------------------

AMP_BATCHES, AMP_BATCH = 8, 32  # one epoch: 16 optimizer steps, one scaler update each
BLOW_UP = 1e30  # finite in float32, so the scaled loss is finite; its gradients overflow float16
# the batches whose discriminator / generator loss is blown up (batch 5: both, one after the other)
BLOWN = {"d": frozenset({1, 5}), "g": frozenset({3, 5})}
# A small growth interval so that the history holds growth as well as back-off; a smaller initial
# scale than the default 2**16 so that growth alone never overflows these gradients.
INIT_SCALE, GROWTH_INTERVAL = 2.0**10, 3
# torch.amp.GradScaler, the loss scaler that runs on a CPU, exists from torch 2.3; before, no step is ever
# skipped on a CPU: there the AMP tests run what Lightning runs for "16-mixed" on a CPU (bf16 autocast,
# no scaler) and assert that instead
CPU_LOSS_SCALER = hasattr(torch.amp, "GradScaler")


def _scaler() -> Any:
    return torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)


def _amp_gan_class(pl: Any) -> type:
    """The GAN of ``_training_models.py`` with losses blown up on ``BLOWN`` batches and a record per step."""

    class AmpGAN(M.gan_class(pl)):  # type: ignore[misc]
        def __init__(self, style: str) -> None:
            super().__init__(style=style)
            self.history: list[dict[str, Any]] = []

        def _loss(self, loss: torch.Tensor, which: str, batch_idx: int) -> torch.Tensor:
            return loss * BLOW_UP if batch_idx in BLOWN[which] else loss

        def _record(self, which: str) -> None:
            # after the step and the untoggle: the state the next statement of training_step sees
            self.history.append({
                "which": which,
                "scale": self.trainer.precision_plugin.scaler.get_scale(),
                "global_step": self.trainer.global_step,
                "requires_grad": [p.requires_grad for p in self.parameters()],
                "params": [p.detach().clone() for p in self.parameters()],
                "grads": [None if p.grad is None else p.grad.detach().clone() for p in self.parameters()],
                "optimizers": [opt.state_dict() for opt in self.trainer.optimizers],
            })

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, z = batch
            g_opt, d_opt = self.optimizers()
            if self.style == "manual":  # Lightning's statement sequence
                self.toggle_optimizer(d_opt)
                d_opt.zero_grad()
                self.manual_backward(self._loss(self.d_loss(x, z), "d", batch_idx))
                d_opt.step()
                self.untoggle_optimizer(d_opt)
                self._record("d")

                self.toggle_optimizer(g_opt)
                g_opt.zero_grad()
                self.manual_backward(self._loss(self.g_loss(z), "g", batch_idx))
                g_opt.step()
                self.untoggle_optimizer(g_opt)
                self._record("g")
            else:
                with self.toggle_optimizer(d_opt):
                    self.manual_backward(self._loss(self.d_loss(x, z), "d", batch_idx))
                self._record("d")

                with self.toggle_optimizer(g_opt):
                    self.manual_backward(self._loss(self.g_loss(z), "g", batch_idx))
                self._record("g")

    return AmpGAN


@functools.cache
def _amp_run(flavour: str, style: str) -> SimpleNamespace:
    """One epoch with the 16-bit AMP plugin; ``manual`` runs Lightning's own toggle methods."""
    pl = M.flavour_module(flavour)
    precision = importlib.import_module(f"{flavour}.plugins.precision")
    model = _amp_gan_class(pl)(style)
    # MixedPrecision since Lightning 2.1; MixedPrecisionPlugin before (same arguments)
    amp = getattr(precision, "MixedPrecision", None) or precision.MixedPrecisionPlugin
    plugin = amp("16-mixed", "cpu", scaler=_scaler()) if CPU_LOSS_SCALER else amp("bf16-mixed", "cpu")
    trainer = pl.Trainer(max_epochs=1, plugins=[plugin], **M.TRAINER_DEFAULTS)
    data = M.loader(AMP_BATCHES * AMP_BATCH, AMP_BATCH)
    if style == "manual":
        with M.lightning_original():
            trainer.fit(model, data)
    else:
        trainer.fit(model, data)
    return SimpleNamespace(model=model, trainer=trainer, scaler=getattr(plugin, "scaler", None))


def _expected_scales() -> list[float]:
    """GradScaler's rule, step by step: halve on an overflow (and restart the count), double after
    ``GROWTH_INTERVAL`` clean steps in a row."""
    scale, clean, scales = INIT_SCALE, 0, []
    for batch in range(AMP_BATCHES):
        for which in ("d", "g"):
            if batch in BLOWN[which]:
                scale, clean = scale * 0.5, 0
            else:
                clean += 1
                if clean == GROWTH_INTERVAL:
                    scale, clean = scale * 2.0, 0
            scales.append(scale)
    return scales


def test_fp16_amp_block_equals_lightning_sequence_with_skipped_steps(flavour: str) -> None:
    block, manual = _amp_run(flavour, "block"), _amp_run(flavour, "manual")
    assert len(block.model.history) == len(manual.model.history) == 2 * AMP_BATCHES
    # after every step: scale, global_step, requires_grad, parameters, gradients (inf/NaN after a
    # skipped step), optimizer state
    for i, (b, m) in enumerate(zip(block.model.history, manual.model.history)):
        _assert_same(b, m, f"step {i}")
    _assert_same(block.model.state_dict(), manual.model.state_dict(), "state_dict")
    _assert_same([p.grad for p in block.model.parameters()], [p.grad for p in manual.model.parameters()], "grads")
    _assert_same([o.state_dict() for o in block.trainer.optimizers],
                 [o.state_dict() for o in manual.trainer.optimizers], "optimizers")
    if CPU_LOSS_SCALER:
        _assert_same(block.scaler.state_dict(), manual.scaler.state_dict(), "scaler")
    else:
        assert block.scaler is None and block.model.dtypes == {"torch.bfloat16"}
    # a skipped step still counts: Lightning counts optimizer.step() calls, not updates
    assert block.trainer.global_step == manual.trainer.global_step == 2 * AMP_BATCHES
    assert all(p.requires_grad for p in block.model.parameters())


def test_fp16_amp_scaler_skips_exactly_the_blown_up_steps(flavour: str) -> None:
    # what makes the comparison above worth something: fp16 autocast ran, steps were skipped
    run = _amp_run(flavour, "block")
    history = run.model.history
    if not CPU_LOSS_SCALER:  # torch < 2.3: no loss scaler on a CPU, so every step is taken, overflow or not
        assert run.model.dtypes == {"torch.bfloat16"} and run.scaler is None
        assert run.trainer.global_step == len(history) == 2 * AMP_BATCHES
        g_state, d_state = (opt.state_dict()["state"] for opt in run.trainer.optimizers)
        assert {float(s["step"]) for st in (g_state, d_state) for s in st.values()} == {AMP_BATCHES}
        return
    assert run.model.dtypes == {"torch.float16"}
    scales = [h["scale"] for h in history]
    assert scales == _expected_scales()
    assert any(later < earlier for earlier, later in itertools.pairwise([INIT_SCALE, *scales]))  # back-off
    assert any(later > earlier for earlier, later in itertools.pairwise([INIT_SCALE, *scales]))  # growth
    init = [p.detach().clone() for p in M.gan_class(M.flavour_module(flavour))().parameters()]
    owner = [name.split(".")[0][0] for name, _ in run.model.named_parameters()]  # "g"enerator, "d"iscriminator
    for i, h in enumerate(history):
        blown = i // 2 in BLOWN[h["which"]]
        before = history[i - 1]["params"] if i else init
        changed = any(not torch.equal(a, b) for a, b in zip(before, h["params"]))
        # the stepped optimizer's gradients (the other's keep what its last backward left)
        finite = all(bool(g.isfinite().all()) for g, o in zip(h["grads"], owner) if o == h["which"])
        assert changed is not blown, f"step {i}"  # a skipped step changes no parameter
        assert finite is not blown, f"step {i}"  # because its gradients overflowed
    # Adam's step count: only the steps taken (optimizers: generator, discriminator)
    g_state, d_state = (opt.state_dict()["state"] for opt in run.trainer.optimizers)
    assert {float(s["step"]) for s in d_state.values()} == {AMP_BATCHES - len(BLOWN["d"])}
    assert {float(s["step"]) for s in g_state.values()} == {AMP_BATCHES - len(BLOWN["g"])}


# -- ddp_spawn: block vs Lightning's sequence on every rank ---------------------------------------------

# a launcher's variables in our environment would make the runs join someone else's process group
_DDP_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PL_GLOBAL_SEED")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DDP_ENV}
    # this checkout's toggleshim, in the script's process and in the children it spawns
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="module")
def spawn_runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Runs ``_spawn_script.py`` once for every flavour; returns ``load(flavour, style, who)``."""
    out = tmp_path_factory.mktemp("spawn-runs")
    proc = subprocess.run(
        [sys.executable, str(Path(spawn.__file__)), str(out), *marked_flavours()],
        capture_output=True, text=True, timeout=900, env=_env(), cwd=ROOT,
    )
    assert proc.returncode == 0, f"spawn script failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"

    def load(flavour: str, style: str, who: str) -> Any:
        return torch.load(out / flavour / f"{style}_{who}.pt", weights_only=True)

    return load


@pytest.mark.one_flavour_by_default
def test_ddp_spawn_block_equals_lightning_sequence_on_every_rank(flavour: str, spawn_runs: Any) -> None:
    b0, b1 = spawn_runs(flavour, "block", "rank0"), spawn_runs(flavour, "block", "rank1")
    m0, m1 = spawn_runs(flavour, "manual", "rank0"), spawn_runs(flavour, "manual", "rank1")
    assert [r["global_rank"] for r in (b0, b1, m0, m1)] == [0, 1, 0, 1]
    assert {r["world_size"] for r in (b0, b1, m0, m1)} == {2}
    # the children ran toggleshim's block, and Lightning's own toggle for the reference
    assert b0["installed_in_steps"] == b1["installed_in_steps"] == [True]
    assert m0["installed_in_steps"] == m1["installed_in_steps"] == [False]
    for block, manual, rank in ((b0, m0, 0), (b1, m1, 1)):
        _assert_same(block["state"], manual["state"], f"rank {rank} state")
        _assert_same(block["optimizers"], manual["optimizers"], f"rank {rank} optimizers")
        assert block["global_step"] == manual["global_step"] == 2 * spawn.BATCHES
        assert all(block["requires_grad"])
    _assert_same(b0["state"], b1["state"], "block: rank 0 vs rank 1")  # the ranks agree
    _assert_same(m0["state"], m1["state"], "manual: rank 0 vs rank 1")
    # what the user holds after fit() returns in the parent: rank 0's weights, trained
    _assert_same(spawn_runs(flavour, "block", "parent")["state"], b0["state"], "parent")
    _assert_same(spawn_runs(flavour, "manual", "parent")["state"], m0["state"], "parent (manual)")
    init = M.gan_class(M.flavour_module(flavour))().state_dict()
    assert all(not torch.equal(b0["state"][k], init[k]) for k in init)


# -- ddp_spawn: where `import toggleshim` must sit ----------------------------------------------------

RULE_FLAVOUR = installed_flavours()[0]  # the rule is multiprocessing's, not a flavour's: one is enough
NONE_WITH = (
    "TypeError: 'NoneType' object does not support the context manager protocol"
    if sys.version_info >= (3, 11) else "AttributeError: __enter__"  # Python 3.10's message for `with None:`
)

GAN_SRC = """\
import torch
from torch import nn
import {flavour} as pl


class GAN(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Linear(2, 2)
        self.discriminator = nn.Linear(2, 1)

    def configure_optimizers(self):
        return [torch.optim.SGD(self.generator.parameters(), lr=0.1),
                torch.optim.SGD(self.discriminator.parameters(), lr=0.1)]

    def training_step(self, batch, batch_idx):
        (x,) = batch
        g_opt, d_opt = self.optimizers()
        softplus = nn.functional.softplus
        with self.toggle_optimizer(d_opt):
            self.manual_backward(softplus(-self.discriminator(x)).mean()
                                 + softplus(self.discriminator(self.generator(x))).mean())
        with self.toggle_optimizer(g_opt):
            self.manual_backward(softplus(-self.discriminator(self.generator(x))).mean())
"""

FIT_SRC = """\
def fit(gan_class):
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import {flavour} as pl

    torch.manual_seed(0)
    model = gan_class()
    before = [p.detach().clone() for p in model.parameters()]
    # one spawned rank: it re-imports the main module as every rank would (where the import must sit)
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy="ddp_spawn_find_unused_parameters_true",
                         max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, DataLoader(TensorDataset(torch.randn(32, 2)), batch_size=4))
    # the parent holds rank 0's weights once fit() returns
    print("trained:", all(not torch.equal(a, b) for a, b in zip(before, model.parameters())), flush=True)
"""


def _files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).format(flavour=RULE_FLAVOUR))


def _run_user(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=_env(), cwd=cwd)


def _assert_trained(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "trained: True" in proc.stdout.splitlines()


def _assert_children_fail_at_the_with(proc: subprocess.CompletedProcess[str]) -> None:
    """The parent fails because a spawned rank ran Lightning's unpatched toggle (it returns None)."""
    assert proc.returncode != 0
    assert "torch.multiprocessing.spawn.ProcessRaisedException" in proc.stderr, proc.stderr[-6000:]
    # the child's traceback, as torch reports it: the `with` line of training_step, then Python's error
    child = proc.stderr.split("terminated with the following error:", 1)[-1]
    assert re.search(r"in training_step\n\s+with self\.toggle_optimizer\(d_opt\):\n(\s*\^+\n)?"
                     + re.escape(NONE_WITH) + r"\n", child), proc.stderr[-6000:]
    assert "trained:" not in proc.stdout


def test_spawn_import_inside_main_works_in_the_children(tmp_path: Path) -> None:
    # The README's example in one file, `import toggleshim` inside main(): each child re-runs only the
    # top level of train.py, but the Trainer it unpickles imports toggleshim first
    _files(tmp_path, {"train.py": GAN_SRC + "\n\n" + FIT_SRC + """

def main():
    import toggleshim
    print("parent patched:", toggleshim.is_installed(), flush=True)
    fit(GAN)


if __name__ == "__main__":
    main()
"""})
    proc = _run_user(tmp_path, "train.py")
    assert "parent patched: True" in proc.stdout.splitlines()
    _assert_trained(proc)


def test_spawn_import_inside_main_with_a_trainer_subclass_fails_in_the_children(tmp_path: Path) -> None:
    # The documented limit: multiprocessing finds a reduction by the exact class, and a subclass of
    # Trainer is the user's: the child never imports toggleshim, and the `with` fails as without it
    subclass = "import {flavour} as pl\n\n\nclass MyTrainer(pl.Trainer):\n    pass\n\n\n"
    subclassed = subclass + FIT_SRC.replace("pl.Trainer(", "MyTrainer(")
    _files(tmp_path, {"train.py": GAN_SRC + "\n\n" + subclassed + """

def main():
    import toggleshim
    fit(GAN)


if __name__ == "__main__":
    main()
"""})
    _assert_children_fail_at_the_with(_run_user(tmp_path, "train.py"))


def test_spawn_import_at_top_of_module_defining_the_lightningmodule_works(tmp_path: Path) -> None:
    # The children unpickle the model, which imports its module: its top level runs in every rank.
    # The main script imports neither toggleshim nor the model at its top level.
    _files(tmp_path, {
        "gan.py": "import toggleshim  # noqa: F401\n" + GAN_SRC,
        "train.py": FIT_SRC + """

def main():
    from gan import GAN

    fit(GAN)


if __name__ == "__main__":
    main()
""",
    })
    _assert_trained(_run_user(tmp_path, "train.py"))


def test_spawn_import_at_top_of_main_script_works(tmp_path: Path) -> None:
    # `python train.py`: each child re-runs train.py's top level as __mp_main__, toggleshim included
    _files(tmp_path, {
        "gan.py": GAN_SRC,
        "train.py": "import toggleshim  # noqa: F401\n\n" + FIT_SRC + """

def main():
    from gan import GAN

    fit(GAN)


if __name__ == "__main__":
    main()
""",
    })
    _assert_trained(_run_user(tmp_path, "train.py"))


def test_spawn_import_at_top_of_package_main_works_under_python_m(tmp_path: Path) -> None:
    # `python -m app` runs app/__main__.py, which multiprocessing never re-runs in a child
    # (spawn.py: "__main__.py files for packages ... run their 'main only' code unconditionally"):
    # the Trainer the child unpickles imports toggleshim
    _files(tmp_path, {
        "app/__init__.py": "",
        "app/gan.py": GAN_SRC,
        "app/__main__.py": "import toggleshim  # noqa: F401\n\nfrom app.gan import GAN\n\n" + FIT_SRC + """

if __name__ == "__main__":
    fit(GAN)
""",
    })
    _assert_trained(_run_user(tmp_path, "-m", "app"))


def _modules_loaded_by(data: bytes) -> set[str]:
    """The modules unpickling ``data`` imports names from (each global the pickle refers to). The
    pickle's other bytes hold the Trainer's state, the checkout's folder among them
    (``default_root_dir``): a folder named ``toggleshim`` is no reference to the package."""
    import io
    import pickle

    found: set[str] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            found.add(module)
            return super().find_class(module, name)

    Recording(io.BytesIO(data)).load()
    return found


def _toggleshims(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] == "toggleshim"}


def test_only_multiprocessing_pickles_a_trainer_through_toggleshim() -> None:
    """The Trainer's reduction is registered with multiprocessing's pickler alone: ``pickle`` (and so
    ``torch.save``, ``copy.deepcopy``) makes of a Trainer what it makes without toggleshim; a pickle for
    a spawned process names toggleshim; ``uninstall()`` takes that back and ``install()`` gives it."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import toggleshim

    pl = importlib.import_module(RULE_FLAVOUR)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    plain = _modules_loaded_by(pickle.dumps(trainer))
    assert pl.Trainer.__module__ in plain and _toggleshims(plain) == set(), plain
    assert _toggleshims(_modules_loaded_by(bytes(ForkingPickler.dumps(trainer)))) == {"toggleshim._spawn"}
    assert type(pickle.loads(bytes(ForkingPickler.dumps(trainer)))) is pl.Trainer
    try:
        toggleshim.uninstall()
        assert _toggleshims(_modules_loaded_by(bytes(ForkingPickler.dumps(trainer)))) == set()
    finally:
        toggleshim.install()
    assert _toggleshims(_modules_loaded_by(bytes(ForkingPickler.dumps(trainer)))) == {"toggleshim._spawn"}
