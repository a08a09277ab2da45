"""The release workflow's gate: the pushed tag, the built distributions and the CHANGELOG agree.

    python scripts/release_check.py --tag v0.1.0 dist/

Exit 0 when ``dist/`` holds exactly one sdist and one wheel of toggleshim, the wheel is pure Python
(``py3-none-any``), both carry the version the tag names (``v`` + version), that version is
``__version__`` in ``toggleshim/__init__.py`` (read as text, so nothing is imported), and
``CHANGELOG.md`` has a dated section for it (``## [0.1.0] - 2026-12-01``). Otherwise every problem is
printed and the exit status is 1 (2 for bad arguments). ``.github/workflows/release.yml`` runs it
before anything is uploaded; ``tests/test_packaging.py`` runs it on a fresh build.
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import re
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "toggleshim"


def source_version(root: Path = ROOT) -> str:
    """``__version__`` from the package's ``__init__.py``, which must assign it a string literal
    (setuptools reads it the same way without importing, see ``[tool.setuptools.dynamic]``)."""
    tree = ast.parse((root / NAME / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__version__" for t in targets):
            assert isinstance(node, ast.Assign)
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value
            raise ValueError("__version__ in toggleshim/__init__.py is not a string literal")
    raise ValueError("toggleshim/__init__.py assigns no __version__")


def _metadata(text: str) -> dict[str, str]:
    message = email.parser.HeaderParser().parsestr(text)
    return {key: str(value) for key, value in message.items()}


def wheel_metadata(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        return _metadata(zf.read(name).decode("utf-8"))


def sdist_metadata(path: Path) -> dict[str, str]:
    with tarfile.open(path) as tf:
        (member,) = [m for m in tf.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")]
        fh = tf.extractfile(member)
        assert fh is not None
        return _metadata(fh.read().decode("utf-8"))


def problems(tag: str, dist: Path, root: Path = ROOT) -> list[str]:
    """Every disagreement between the tag, the distributions in ``dist`` and the sources."""
    found: list[str] = []
    if not re.fullmatch(r"v\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?", tag):
        return [f"tag {tag!r} is not v<version> (e.g. v0.1.0)"]
    version = tag[1:]
    try:
        declared = source_version(root)
    except ValueError as exc:
        found.append(str(exc))
    else:
        if declared != version:
            found.append(f"tag {tag} names {version}, toggleshim/__init__.py says __version__ = {declared!r}")
    sdists = sorted(dist.glob("*.tar.gz"))
    wheels = sorted(dist.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        found.append(f"{dist} holds {len(sdists)} sdist(s) and {len(wheels)} wheel(s), expected one of each")
    for path in sdists:
        if path.name != f"{NAME}-{version}.tar.gz":
            found.append(f"sdist {path.name}: expected {NAME}-{version}.tar.gz")
        meta = sdist_metadata(path)
        if (meta.get("Name"), meta.get("Version")) != (NAME, version):
            found.append(f"sdist {path.name}: PKG-INFO says {meta.get('Name')} {meta.get('Version')}")
    for path in wheels:
        if path.name != f"{NAME}-{version}-py3-none-any.whl":
            found.append(f"wheel {path.name}: expected {NAME}-{version}-py3-none-any.whl (pure Python)")
        meta = wheel_metadata(path)
        if (meta.get("Name"), meta.get("Version")) != (NAME, version):
            found.append(f"wheel {path.name}: METADATA says {meta.get('Name')} {meta.get('Version')}")
    changelog = root / "CHANGELOG.md"
    text = changelog.read_text(encoding="utf-8") if changelog.is_file() else ""
    if not re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.MULTILINE):
        found.append(f"CHANGELOG.md has no section '## [{version}] - YYYY-MM-DD'")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", required=True, help="the pushed tag, e.g. v0.1.0")
    parser.add_argument("dist", type=Path, help="the directory python -m build wrote")
    args = parser.parse_args(argv)
    if not args.dist.is_dir():
        parser.error(f"{args.dist} is not a directory")
    found = problems(args.tag, args.dist)
    for problem in found:
        print(f"release check: {problem}", file=sys.stderr)
    if found:
        return 1
    print(f"release check: {args.tag} matches {NAME} {args.tag[1:]} (sdist, wheel, __version__, CHANGELOG.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
