#!/usr/bin/env python
"""Fingerprint Lightning's ``toggle_optimizer`` / ``untoggle_optimizer`` in every release of the matrix,
without installing any of them, and write ``toggleshim/_known.py`` (the code the gate trusts).

    python scripts/fingerprints.py                 # every release of the matrix, both distributions
    python scripts/fingerprints.py --check         # exit 1 if toggleshim/_known.py is not what it gives
    python scripts/fingerprints.py --print lightning==2.6.6
    python scripts/fingerprints.py --checkout /path/to/pytorch-lightning   # a local checkout (the canary)

Each release's wheel is fetched with ``pip download --no-deps`` into a temporary directory and the
module that defines ``LightningModule`` is read out of the archive; nothing is installed or imported.
The releases are ``LIGHTNING_VERSIONS`` of ``noxfile.py`` (read as text: nox need not be installed),
of both distributions, ``lightning`` (``lightning/pytorch/core/module.py``) and ``pytorch-lightning``
(``pytorch_lightning/core/module.py``). Runs on any Python >= 3.10; the fingerprints do not depend on it
(``toggleshim/_fingerprint.py`` explains why).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
KNOWN = ROOT / "toggleshim" / "_known.py"
METHODS = ("toggle_optimizer", "untoggle_optimizer")
# distribution -> the module file that defines LightningModule, inside the wheel or a checkout's src/
MODULE_FILES = {
    "lightning": "lightning/pytorch/core/module.py",
    "pytorch-lightning": "pytorch_lightning/core/module.py",
}


def _fingerprint_module() -> ModuleType:
    """toggleshim/_fingerprint.py loaded by path (no torch, no toggleshim install needed)."""
    spec = importlib.util.spec_from_file_location("_toggleshim_fingerprint", ROOT / "toggleshim" / "_fingerprint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FP = _fingerprint_module()


def matrix_versions() -> list[str]:
    """``LIGHTNING_VERSIONS`` from noxfile.py (parsed, not imported)."""
    for node in ast.parse((ROOT / "noxfile.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "LIGHTNING_VERSIONS" for t in node.targets):
            versions = ast.literal_eval(node.value)
            assert isinstance(versions, list)
            return [str(v) for v in versions]
    raise SystemExit("noxfile.py has no LIGHTNING_VERSIONS")


def _read_member(archive: Path, suffix: str) -> str:
    """The text of the archive member whose path ends with ``suffix`` (wheel, or sdist as fallback)."""
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if n.endswith(suffix)]
            if names:
                return zf.read(min(names, key=len)).decode()
    else:
        with tarfile.open(archive) as tf:
            members = [m for m in tf.getmembers() if m.name.endswith(suffix)]
            if members:
                fh = tf.extractfile(min(members, key=lambda m: len(m.name)))
                assert fh is not None
                return fh.read().decode()
    raise SystemExit(f"{archive.name} has no {suffix}")


def release_fingerprints(dist: str, version: str, tmp: Path) -> dict[str, str]:
    """The two fingerprints of ``dist==version``, from its wheel (downloaded, never installed)."""
    if version in ("2.6.2", "2.6.3"):
        raise SystemExit("2.6.2 and 2.6.3 were withdrawn after a supply-chain compromise: never fetch them")
    dest = tmp / f"{dist}-{version}"
    dest.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
         "--dest", str(dest), f"{dist}=={version}"],
        check=True,
    )  # fmt: skip
    (archive,) = dest.iterdir()
    found = FP.methods_in_source(_read_member(archive, MODULE_FILES[dist]), "LightningModule", METHODS)
    if set(found) != set(METHODS):
        raise SystemExit(f"{dist} {version}: LightningModule lacks {sorted(set(METHODS) - set(found))}")
    return dict(found)


def checkout_fingerprints(path: Path) -> dict[str, dict[str, str]]:
    """The fingerprints in a local Lightning checkout (``src/`` of the GitHub repository), per module."""
    result = {}
    for dist, rel in MODULE_FILES.items():
        file = path / "src" / rel
        if file.exists():
            result[dist] = dict(FP.methods_in_source(file.read_text(), "LightningModule", METHODS))
    if not result:
        wanted = " nor ".join(f"src/{rel}" for rel in MODULE_FILES.values())
        raise SystemExit(f"{path} holds neither {wanted}")
    return result


def collect(versions: list[str]) -> dict[tuple[str, str], list[str]]:
    """(toggle fingerprint, untoggle fingerprint) -> the releases that ship that pair."""
    known: dict[tuple[str, str], list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="toggleshim-fp-") as tmp:
        for version in versions:
            for dist in MODULE_FILES:
                fps = release_fingerprints(dist, version, Path(tmp))
                print(f"{dist:<18} {version:<12} toggle {fps[METHODS[0]][:12]}  untoggle {fps[METHODS[1]][:12]}")
                known.setdefault((fps[METHODS[0]], fps[METHODS[1]]), []).append(f"{dist} {version}")
    return known


def render(known: dict[tuple[str, str], list[str]], versions: list[str]) -> str:
    lines = [
        '"""Lightning toggle code that toggleshim has verified: generated by ``python scripts/fingerprints.py``.',
        "",
        "(fingerprint of ``toggle_optimizer``, fingerprint of ``untoggle_optimizer``) -> the releases seen with",
        "that code (``toggleshim/_fingerprint.py`` defines the fingerprint). Do not edit by hand: add a release",
        "to the matrix (noxfile.py, the workflow), run the script, and commit what it writes.",
        '"""',
        "",
        f"#: the matrix this was generated from: {', '.join(versions)}",
        "KNOWN: dict[tuple[str, str], list[str]] = {",
    ]
    for (toggle, untoggle), releases in known.items():
        lines.append(f'    (\n        "{toggle}",\n        "{untoggle}",\n    ): [')
        lines += [f'        "{r}",' for r in releases]
        lines.append("    ],")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if toggleshim/_known.py differs (writes nothing)")
    parser.add_argument("--print", metavar="DIST==VERSION", help="print one release's fingerprints and stop")
    parser.add_argument(
        "--checkout", type=Path, help="print a local Lightning checkout's fingerprints; exit 1 if not verified"
    )
    args = parser.parse_args(argv)
    if args.print:
        dist, _, version = args.print.partition("==")
        with tempfile.TemporaryDirectory(prefix="toggleshim-fp-") as tmp:
            for name, fp in release_fingerprints(dist, version, Path(tmp)).items():
                print(f"{name:<20} {fp}")
        return 0
    if args.checkout:
        namespace: dict[str, object] = {}
        exec(KNOWN.read_text(), namespace)
        known = namespace["KNOWN"]
        assert isinstance(known, dict)
        unknown = 0
        for dist, fps in checkout_fingerprints(args.checkout).items():
            pair = (fps.get(METHODS[0]), fps.get(METHODS[1]))
            seen = known.get(pair)
            unknown += seen is None
            verdict = f"known ({', '.join(seen)})" if seen else "UNKNOWN: toggle code changed, not verified"
            print(f"{dist:<18} toggle {str(pair[0])[:12]}  untoggle {str(pair[1])[:12]}  {verdict}")
        return 1 if unknown else 0
    versions = matrix_versions()
    known = collect(versions)
    text = render(known, versions)
    if args.check:
        same = KNOWN.exists() and KNOWN.read_text() == text
        verdict = "up to date" if same else "OUT OF DATE: run python scripts/fingerprints.py"
        print(f"{KNOWN.relative_to(ROOT)} is {verdict}")
        return 0 if same else 1
    KNOWN.write_text(text)
    releases = sum(len(r) for r in known.values())
    print(f"wrote {KNOWN.relative_to(ROOT)}: {releases} releases, {len(known)} distinct pair(s) of fingerprints")
    return 0


if __name__ == "__main__":
    sys.exit(main())
