"""The optional C kernels (toggleshim/_speedups.c); everything else is in pyproject.toml.

``optional=True``: without a C compiler the build goes on and toggleshim runs its Python kernels,
which behave identically (``python -m toggleshim check`` reports which are in use).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("toggleshim._speedups", ["toggleshim/_speedups.c"], optional=True)])
