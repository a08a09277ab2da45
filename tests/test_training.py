"""Real training with the block: a real ``Trainer``, each Lightning flavour (the ``flavour`` argument,
parametrized by ``conftest.py``), CPU only.

Every comparison trains the same tiny model twice from the same seeded weights and data: once with
``with self.toggle_optimizer(...)`` and once with Lightning's own statement sequence (toggle;
zero_grad; backward; step; untoggle, run with toggleshim *uninstalled*), and asks for bit-identical
parameters. Models live in ``_training_models.py``; the DDP runs in ``_ddp_script.py`` (a subprocess,
because Lightning's ``ddp`` strategy launches rank 1 by re-running the command line).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import _ddp_script as ddp
import _training_models as M
import pytest
import torch
from _fixtures import compile_refused, marked_flavours
from _training_models import one_thread  # noqa: F401  (an autouse fixture)
from filelock import FileLock

ROOT = Path(__file__).resolve().parent.parent
BATCHES, BATCH = 8, 32  # one epoch: 8 training steps, 16 optimizer steps
CLIP = 0.05  # below the discriminator's usual gradient norm (~0.3), so clipping has work to do


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k.replace("_orig_mod.", ""): v.detach().clone() for k, v in module.state_dict().items()}


def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"not bit-identical: {differ}"


def _assert_trained(state: dict[str, torch.Tensor], init: dict[str, torch.Tensor]) -> None:
    unchanged = [k for k in init if torch.equal(state[k], init[k])]
    assert not unchanged, f"never updated: {unchanged}"


def _init_gan(flavour: str) -> dict[str, torch.Tensor]:
    return _state(M.gan_class(M.flavour_module(flavour))())


def _fit(flavour: str, model: Any, manual: bool = False, **trainer_kw: Any) -> Any:
    """One epoch of ``BATCHES`` batches; ``manual`` runs it with Lightning's own toggle methods."""
    trainer = M.flavour_module(flavour).Trainer(max_epochs=1, **M.TRAINER_DEFAULTS, **trainer_kw)
    data = M.loader(BATCHES * BATCH, BATCH)
    if manual:
        with M.lightning_original():
            trainer.fit(model, data)
    else:
        trainer.fit(model, data)
    return trainer


@functools.cache
def _gan(flavour: str, style: str, precision: str | None = None, **options: Any) -> SimpleNamespace:
    """The GAN trained once per (flavour, style, options); several tests read the same run."""
    model = M.gan_class(M.flavour_module(flavour))(style=style, **options)
    trainer = _fit(flavour, model, manual=style == "manual", **({"precision": precision} if precision else {}))
    return SimpleNamespace(model=model, trainer=trainer, state=_state(model))


# -- the example -----------------------------------------------------------------------------


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("toggleshim_example_gan", ROOT / "examples" / "gan.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_gan_example_trains_logs_and_draws(flavour: str, tmp_path: Path, capsys: Any) -> None:
    gan = _example()
    png = tmp_path / "out" / "gan.png"
    steps = 40
    result = gan.main(["--steps", str(steps), "--batch-size", "64", "--print-every", "10",
                       "--out", str(png), "--flavour", flavour])

    assert result.trainer.global_step == 2 * steps  # one D and one G step per training step
    for key in ("d_loss", "g_loss", "d_real", "d_fake"):
        values = result.history[key]
        assert len(values) == steps and all(math.isfinite(v) for v in values), key
        # computed inside a block, logged after it: the last step's value is what Lightning holds
        assert float(result.trainer.logged_metrics[key]) == values[-1]
        assert float(result.trainer.callback_metrics[key]) == values[-1]
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the example seeds 0 right before building the model
        init = _state(gan.make_gan_class(M.flavour_module(flavour))())
    _assert_trained(_state(result.model), init)

    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert len(printed) == 5 and all("d_loss" in line and "g_loss" in line for line in printed)

    if importlib.util.find_spec("matplotlib") is not None:
        assert result.png == png
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000
    else:
        assert result.png is None and not png.exists()


# -- one process: block vs Lightning's statements ------------------------------------------------


@pytest.mark.parametrize("style", ["block", "typed"])
def test_gan_block_equals_lightning_sequence(flavour: str, style: str) -> None:
    block, manual = _gan(flavour, style), _gan(flavour, "manual")
    _assert_bitwise(block.state, manual.state)
    _assert_trained(block.state, _init_gan(flavour))
    assert block.trainer.global_step == manual.trainer.global_step == 2 * BATCHES
    # toggling restored everything after the last block
    assert all(p.requires_grad for p in block.model.parameters())


def test_values_computed_inside_blocks_are_logged_after_them(flavour: str) -> None:
    run, manual = _gan(flavour, "block"), _gan(flavour, "manual")
    trainer = run.trainer
    for key in ("d_loss", "g_loss"):
        expected = run.model.last[key]  # the last step's loss, computed inside its block
        assert float(trainer.callback_metrics[key]) == expected
        assert float(trainer.logged_metrics[key]) == expected
        assert float(trainer.progress_bar_metrics[key]) == expected
        assert float(manual.trainer.callback_metrics[key]) == expected


def test_bf16_mixed_block_equals_lightning_sequence(flavour: str) -> None:
    block = _gan(flavour, "block", precision="bf16-mixed")
    manual = _gan(flavour, "manual", precision="bf16-mixed")
    assert block.model.dtypes == manual.model.dtypes == {"torch.bfloat16"}  # autocast ran in the blocks
    _assert_bitwise(block.state, manual.state)
    _assert_trained(block.state, _init_gan(flavour))
    assert not all(torch.equal(block.state[k], _gan(flavour, "block").state[k]) for k in block.state)


def test_clip_gradients_inside_block_clips_before_exit_step(flavour: str) -> None:
    block, manual = _gan(flavour, "block", clip=CLIP), _gan(flavour, "manual", clip=CLIP)
    _assert_bitwise(block.state, manual.state)
    clips = [r for r in block.model.records if r["which"] == "clip"]
    d_steps = [r for r in block.model.records if r["which"] == "step" and r["opt"] == "d"]
    assert len(clips) == len(d_steps) == BATCHES
    assert all(c["before"] > 2 * CLIP for c in clips)  # every step had gradients to clip...
    assert all(s["norm"] <= CLIP * (1 + 1e-5) for s in d_steps)  # ...and the exit's step() saw them clipped
    unclipped = _gan(flavour, "block").state
    assert not torch.equal(block.state["discriminator.0.weight"], unclipped["discriminator.0.weight"])


def test_lr_schedulers_stepped_after_blocks_equal_lightning_sequence(flavour: str) -> None:
    block, manual = _gan(flavour, "block", schedulers=True), _gan(flavour, "manual", schedulers=True)
    _assert_bitwise(block.state, manual.state)
    lrs = [opt.param_groups[0]["lr"] for opt in block.trainer.optimizers]
    assert lrs == [opt.param_groups[0]["lr"] for opt in manual.trainer.optimizers]
    lr = block.model.lr
    assert lrs == pytest.approx([lr * 0.5 ** (BATCHES // 2), lr * 0.9**BATCHES])  # StepLR(2, .5), ExponentialLR(.9)
    assert not torch.equal(block.state["generator.0.weight"], _gan(flavour, "block").state["generator.0.weight"])


def test_lbfgs_closure_step_inside_block_equals_lightning_sequence(flavour: str) -> None:
    cls = M.lbfgs_class(M.flavour_module(flavour))
    init = _state(cls())
    block, manual = cls(style="block"), cls(style="manual")
    block_trainer = _fit(flavour, block)
    _fit(flavour, manual, manual=True)
    _assert_bitwise(_state(block), _state(manual))
    _assert_trained(_state(block), init)
    assert block.closure_calls == manual.closure_calls > BATCHES  # LBFGS re-evaluated the closure
    assert block_trainer.global_step == 2 * BATCHES
    assert all(p.requires_grad for p in block.parameters())


# -- torch.compile ---------------------------------------------------------------------------


def _error_of(run: Callable[[], object]) -> Exception | None:
    try:
        run()
    except Exception as error:
        return error
    return None


def test_compiled_networks_train_with_block_like_eager(flavour: str) -> None:
    # Compile the networks, not the LightningModule: compiling the whole module makes dynamo trace
    # training_step, where Lightning's own self.log fails on torch 2.13 (see the report).
    # torch.compile(module), not module.compile(): on torch 2.13 the latter compiles nothing.
    def compiled_gan(style: str) -> Any:
        model = M.gan_class(M.flavour_module(flavour))(style=style)
        model.generator = torch.compile(model.generator)
        model.discriminator = torch.compile(model.discriminator)
        return model

    refused = compile_refused()
    if refused is not None:  # torch 2.0 on Python 3.11: no compiled network can run, with or without toggleshim
        with pytest.raises(RuntimeError, match=re.escape(refused)):
            compiled_gan("block").generator(torch.ones(1, 8))
        return
    torch._dynamo.reset()
    try:
        # torch 2.1's inductor reuses the graph it compiled for frozen parameters once they train again
        # ("addmm(): functions with out=... arguments don't support automatic differentiation"): there,
        # Lightning's own manual sequence fails, and the block must fail exactly so
        with M.lightning_original():
            manual = _error_of(lambda: _fit(flavour, compiled_gan("manual")))
        torch._dynamo.reset()
        model = compiled_gan("block")
        if manual is not None:
            block = _error_of(lambda: _fit(flavour, model))
            assert (type(block), str(block)) == (type(manual), str(manual)), (block, manual)
            return
        trainer = _fit(flavour, model)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    # both networks, each with and without its parameters frozen by the toggle
    assert graphs >= 4
    compiled, eager = _state(model), _gan(flavour, "block").state
    assert compiled.keys() == eager.keys()
    for key in eager:  # inductor's fused kernels round differently: close, not bit-identical
        torch.testing.assert_close(compiled[key], eager[key], rtol=1e-4, atol=1e-6)
    _assert_trained(compiled, _init_gan(flavour))
    assert trainer.global_step == 2 * BATCHES


# -- DDP (two CPU processes, gloo) -------------------------------------------------------------

# a launcher's variables in our environment would make the script join someone else's process group
_DDP_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PL_GLOBAL_SEED")


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Runs ``_ddp_script.py`` once per session for every flavour; returns ``load(flavour, fit, rank)``.

    Under pytest-xdist the workers share one run (made by whichever gets the lock first): two
    concurrent two-process DDP runs on two cores would only slow each other down.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this session's directory, shared by its workers
    out = base / "ddp-runs"
    with FileLock(f"{out}.lock"):
        if not (out / "done").exists():
            env = {k: v for k, v in os.environ.items() if k not in _DDP_ENV}
            proc = subprocess.run(
                [sys.executable, str(Path(ddp.__file__)), str(out), *marked_flavours()],
                capture_output=True, text=True, timeout=600, env=env, cwd=ROOT,
            )
            assert proc.returncode == 0, f"DDP script failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
            (out / "done").write_text("ok")

    def load(flavour: str, fit: str, rank: int) -> Any:
        return torch.load(out / flavour / f"{fit}_rank{rank}.pt", weights_only=True)

    return load


def _ranks(load: Any, flavour: str, fit: str) -> tuple[Any, Any]:
    r0, r1 = load(flavour, fit, 0), load(flavour, fit, 1)
    assert r0["world_size"] == r1["world_size"] == 2
    return r0, r1


@pytest.mark.one_flavour_by_default
def test_ddp_gan_block_equals_lightning_sequence_on_every_rank(flavour: str, ddp_runs: Any) -> None:
    b0, b1 = _ranks(ddp_runs, flavour, "gan_block")
    m0, m1 = _ranks(ddp_runs, flavour, "gan_manual")
    _assert_bitwise(b0["state"], b1["state"])  # the ranks agree...
    _assert_bitwise(m0["state"], m1["state"])
    _assert_bitwise(b0["state"], m0["state"])  # ...and the block is Lightning's sequence, bit for bit
    _assert_trained(b0["state"], _init_gan(flavour))
    assert b0["global_step"] == m0["global_step"] == 2 * ddp.BATCHES
    assert len(b0["records"]) == 2 * ddp.BATCHES
    for r0, r1 in zip(b0["records"], b1["records"]):
        # every backward was all-reduced: the ranks (fed different data) hold the same gradient
        assert r0["sync"] and r0["allreduce_calls"] > 0
        assert torch.equal(r0["grad"], r1["grad"])


@pytest.mark.one_flavour_by_default
def test_ddp_without_find_unused_parameters_fails(flavour: str, ddp_runs: Any) -> None:
    # Why the advice is DDPStrategy(find_unused_parameters=True): while one optimizer is toggled, the
    # other's parameters are frozen and get no gradient, which plain DDP's reducer refuses.
    for rank in (0, 1):
        run = ddp_runs(flavour, "plain_ddp", rank)
        assert run["error"] is not None and "find_unused_parameters" in run["error"]
        assert run["global_step"] == 1  # the discriminator stepped; the generator's backward failed


@pytest.mark.one_flavour_by_default
def test_ddp_accumulation_block_equals_toggle_model_recipe(flavour: str, ddp_runs: Any) -> None:
    b0, b1 = _ranks(ddp_runs, flavour, "acc_block")
    m0, m1 = _ranks(ddp_runs, flavour, "acc_manual")
    _assert_bitwise(b0["state"], b1["state"])
    _assert_bitwise(b0["state"], m0["state"])
    _assert_bitwise(b1["state"], m1["state"])
    _assert_trained(b0["state"], _init_gan(flavour))
    assert b0["global_step"] == m0["global_step"] == 2 * ddp.BATCHES // ddp.ACCUMULATE
    assert b0["metrics"] == m0["metrics"]


@pytest.mark.one_flavour_by_default
def test_ddp_accumulation_all_reduces_only_on_last_micro_batch(flavour: str, ddp_runs: Any) -> None:
    b0, b1 = _ranks(ddp_runs, flavour, "acc_block")
    m0, _ = _ranks(ddp_runs, flavour, "acc_manual")
    assert len(b0["records"]) == len(m0["records"]) == 2 * ddp.BATCHES
    for r0, r1, ref in zip(b0["records"], b1["records"], m0["records"]):
        last = (r0["batch"] + 1) % ddp.ACCUMULATE == 0
        assert r0["sync"] is last  # DDP's require_backward_grad_sync inside the block
        assert (r0["allreduce_calls"] > 0) is last  # the comm hook ran on the last micro-batch only
        # without the all-reduce each rank keeps its own gradient; with it they agree
        assert torch.equal(r0["grad"], r1["grad"]) is last
        assert (ref["sync"], ref["allreduce_calls"]) == (r0["sync"], r0["allreduce_calls"])
        assert torch.equal(ref["grad"], r0["grad"])


@pytest.mark.one_flavour_by_default
def test_ddp_sync_restored_after_exception_in_sync_grad_false_block(flavour: str, ddp_runs: Any) -> None:
    e0, e1 = _ranks(ddp_runs, flavour, "explode")
    for run in (e0, e1):
        (boom,) = [r for r in run["records"] if r["which"] == "explode"]
        assert boom["sync_inside"] is False  # no_sync was on inside the block...
        assert boom["sync_after"] is True  # ...and off again after the exception left it
        assert boom["requires_grad_after"] is True and boom["toggle_record_after"] == 0
        after = [r for r in run["records"] if r.get("batch") == ddp.EXPLODE_AT]
        assert after and all(r["sync"] and r["allreduce_calls"] > 0 for r in after)
    _assert_bitwise(e0["state"], e1["state"])
    assert e0["global_step"] == 2 * ddp.BATCHES
