"""toggleshim: ``with self.toggle_optimizer(opt):`` for PyTorch Lightning manual optimization.

Importing the package patches ``LightningModule.toggle_optimizer`` on every installed Lightning
flavour (``lightning.pytorch`` and ``pytorch_lightning``), see :func:`install`. Statement-style code
keeps Lightning's exact behaviour; the returned :class:`Toggle` is also a context manager that zeroes
gradients on entry, steps on a clean exit and always untoggles. For type-checked code,
``with toggleshim.toggle(self, opt):`` is the same block with a precise type.
"""

from toggleshim._block import Toggle, toggle
from toggleshim._patch import ToggleshimWarning, _install_at_import, install, is_installed, uninstall

__all__ = ["Toggle", "ToggleshimWarning", "__version__", "install", "is_installed", "toggle", "uninstall"]
__version__ = "0.1.0"

# install(), except that a ToggleshimWarning the filters turn into an error (python -W error) is
# raised from toggleshim's next entry point instead of failing this import
_install_at_import()
