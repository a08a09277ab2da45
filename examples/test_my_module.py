"""Run toggleshim's harness against *your* LightningModule and optimizers.

    pytest examples/test_my_module.py

Replace ``make`` with your own module and optimizers (built deterministically: both worlds must
start identical). Hypothesis draws programs of blocks, statements, nesting, user changes and faults
over your optimizers; the shim must equal the model at every point and, for flat programs,
Lightning's manual sequence bitwise.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

try:  # either Lightning flavour: the `lightning` package or the standalone `pytorch_lightning`
    from lightning.pytorch import LightningModule
except ImportError:
    from pytorch_lightning import LightningModule  # type: ignore[assignment, no-redef]
from torch import nn

import toggleshim  # noqa: F401  (installs the shim)
from toggleshim.testing import assert_program_equivalent, programs, user_world


class MyGAN(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)  # identical worlds
        self.generator = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 1))


def make():  # type: ignore[no-untyped-def]
    module = MyGAN()
    optimizers = [torch.optim.Adam(module.generator.parameters(), lr=1e-3),
                  torch.optim.SGD(module.discriminator.parameters(), lr=0.1, momentum=0.9)]
    return user_world(module, optimizers)


N_PARAMS = len(list(MyGAN().parameters()))


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_my_module_block_equals_manual(data: st.DataObject) -> None:
    program = data.draw(programs(n_optimizers=2, n_params=N_PARAMS, n_terms=N_PARAMS))
    assert_program_equivalent(make, program)
