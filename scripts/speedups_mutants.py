"""Measure the differential test of the C kernels: plant each bug below in ``_speedups.c``, expect a failure.

    python scripts/speedups_mutants.py          # every mutant, then the unaltered code

Each mutant is built in a temporary copy of the package (``setup.py build_ext --inplace``, a C
compiler is needed) and ``tests/test_speedups.py`` runs against it in a fresh process (the copy
comes first on ``sys.path``). ``scripts/mutation_score.py`` does the same for the Python code
(the property suite against the shim's and Lightning's bugs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "toggleshim/_speedups.c"

MUTANTS: dict[str, tuple[str, str]] = {
    "exit ignores the values' identity": (
        "if (i >= n || value != PyTuple_GET_ITEM(vals, i))", "if (i >= n)"),
    "layout without its end markers": (
        "        if (push(seq, &k, &built, END) < 0)\n            goto error;\n", ""),
    "toggle freezes before it reads": (
        "    Py_ssize_t n = PyTuple_GET_SIZE(managed);\n    PyObject *vals",
        "    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(free_); j++)\n"
        "        PyObject_SetAttr(PyTuple_GET_ITEM(free_, j), S_requires_grad, Py_False);\n"
        "    Py_ssize_t n = PyTuple_GET_SIZE(managed);\n    PyObject *vals"),
    "exit accepts a dict subclass record": (
        "    if (!PyDict_CheckExact(record))\n        Py_RETURN_FALSE;", ""),
    "exit swallows every exception": (
        "if (!PyErr_ExceptionMatches(PyExc_Exception))\n            return NULL;", ""),
    "a shorter layout is taken for the plan's": (
        "if (built == NULL && k != PyTuple_GET_SIZE(seq)) {", "if (0) {"),
    "exit ignores changed values": (
        "    if (same <= 0)\n        return same < 0 ? NULL : Py_NewRef(Py_False);", ""),
    "exit compares record sizes only": (
        "same = PyObject_RichCompareBool(last_record, record, Py_EQ);",
        "same = PyDict_GET_SIZE(last_record) == PyDict_GET_SIZE(record);"),
    "list subclasses read without iterating": (
        "if (!PyList_CheckExact(params) && !PyTuple_CheckExact(params)) {", "if (!PySequence_Check(params)) {"),
    "toggle skips its first free parameter": (
        "    n = PyTuple_GET_SIZE(free_);\n    for (Py_ssize_t i = 0;",
        "    n = PyTuple_GET_SIZE(free_);\n    for (Py_ssize_t i = 1;"),
    "the toggled marker is not written": (
        "if ((opt == optimizer || opt == inner) && push(seq, &k, &built, TOGGLED) < 0)", "if (0)"),
}


def run(source: str, work: Path) -> tuple[bool, str]:
    """Build ``source`` as the C kernels of a copy of the package in ``work``; run the differential test."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(ROOT / "toggleshim", work / "toggleshim", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copytree(ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "conftest.py", "README.md"):
        shutil.copy(ROOT / name, work / name)
    (work / SOURCE).write_text(source)
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=work,
                           capture_output=True, text=True)
    if build.returncode or not list((work / "toggleshim").glob("_speedups*.so")):
        return False, "build failed: " + build.stderr[-300:]
    env = {k: v for k, v in os.environ.items() if k not in ("TOGGLESHIM_PURE_PYTHON", "TOGGLESHIM_MUTANT")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", "tests/test_speedups.py"],
                          cwd=work, env=env, capture_output=True, text=True)
    return proc.returncode == 0, (proc.stdout.strip().splitlines() or [""])[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="only this mutant (repeatable)")
    args = parser.parse_args()
    original = (ROOT / SOURCE).read_text()
    names = args.only or list(MUTANTS)
    caught = 0
    print("| mutant | caught | seconds | pytest |\n|---|---|---:|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "copy"
        for name in names:
            old, new = MUTANTS[name]
            if original.count(old) != 1:
                raise SystemExit(f"mutant {name!r} no longer applies once to {SOURCE}: update {__file__}")
            start = time.perf_counter()
            passed, last = run(original.replace(old, new), work)
            caught += not passed and not last.startswith("build failed")
            seconds = time.perf_counter() - start
            print(f"| {name} | {'yes' if not passed else '**NO**'} | {seconds:.0f} | {last} |", flush=True)
        start = time.perf_counter()
        clean, last = run(original, work)
        seconds = time.perf_counter() - start
        print(f"| (unaltered code) | {'passes' if clean else '**FAILS**'} | {seconds:.0f} | {last} |")
    print(f"\nscore: {caught}/{len(names)} mutants caught; unaltered code {'passes' if clean else 'FAILS'}")
    return 0 if caught == len(names) and clean else 1


if __name__ == "__main__":
    sys.exit(main())
