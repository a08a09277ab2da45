"""Lightning toggle code certified for one project: ``python -m toggleshim certify``'s record, read by the gate.

Where ``_known.py`` does not verify a flavour's two methods, ``_patch._classify`` asks :func:`lookup`: a
pair certified by *this* toggleshim version gets the shim, said once at INFO on the ``toggleshim``
logger (nothing a warnings filter turns into an error). The certificate: ``$TOGGLESHIM_CERTIFIED``, else
the nearest ``toggleshim-certified.json`` from the working directory up. Also the choices an unverified
Lightning leaves (:func:`choices`). Standard library only: ``import toggleshim`` reads this.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toggleshim._known import KNOWN

__all__ = ["ENV", "FILENAME", "CertificateError", "Lookup", "choices", "location", "lookup", "read", "same_code"]

FILENAME = "toggleshim-certified.json"
ENV = "TOGGLESHIM_CERTIFIED"
_log = logging.getLogger("toggleshim")
_announced: set[tuple[str, str, str]] = set()  # (toggle, untoggle, file) said at INFO level once a process


def version() -> str:
    # __init__.py sets __version__ before its install() (which asks us) runs
    return str(getattr(sys.modules.get("toggleshim"), "__version__", "unknown"))


def _cwd() -> Path | None:
    try:
        return Path.cwd()
    except OSError:  # the working directory was removed
        return None


def location() -> Path | None:
    """The certificate file that applies here, if any."""
    named = os.environ.get(ENV)
    if named:
        return Path(named)
    cwd = _cwd()
    for directory in (cwd, *cwd.parents) if cwd is not None else ():
        if (directory / FILENAME).is_file():
            return directory / FILENAME
    return None


class CertificateError(ValueError):
    """A certificate file that exists but cannot be read as one (its path and the problem named)."""


def read(path: Path) -> list[dict[str, Any]]:
    """The entries of the certificate at ``path`` (none if it does not exist); CertificateError if not one."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CertificateError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CertificateError(f"{path}: not JSON ({exc})") from exc
    entries = data.get("certified") if isinstance(data, dict) else None
    keys = ("toggle_optimizer", "untoggle_optimizer", "toggleshim")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and all(isinstance(e.get(k), str) for k in keys) for e in entries
    ):
        raise CertificateError(
            f"{path}: not a toggleshim certificate (a JSON object whose \"certified\" is a list of entries, "
            f"each with {', '.join(keys)})"
        )
    return entries


def same_code(e: dict[str, Any], toggle: str, untoggle: str) -> bool:
    """``e`` is about this pair of methods, certified by this toggleshim version."""
    return (e["toggle_optimizer"], e["untoggle_optimizer"], e["toggleshim"]) == (toggle, untoggle, version())


@dataclass(frozen=True)
class Lookup:
    """What the certificate says of a pair: ``certified``, and why (``reason``: empty if nothing to say)."""

    certified: bool
    reason: str


def lookup(toggle: str, untoggle: str, label: str) -> Lookup:
    """Whether the fingerprint pair of flavour ``label`` is certified here for this toggleshim."""
    path = location()
    if path is None:
        return Lookup(False, "")
    try:
        entries = read(path)
    except CertificateError as exc:
        return Lookup(False, f"the certificate {exc}: no certificate applies")
    if not path.exists():
        return Lookup(False, f"${ENV} names {path}, which does not exist")
    for e in entries:
        if same_code(e, toggle, untoggle):
            ran = f", {e['examples']} random worlds a property" if isinstance(e.get("examples"), int) else ""
            reason = (f"toggle code certified locally: every property of toggleshim {e['toggleshim']}'s check "
                      f"passed on it ({e.get('date', 'undated')}{ran}; {path})")
            key = (toggle, untoggle, str(path))
            if key not in _announced:
                _announced.add(key)
                _log.info("%s: %s; the shim is installed as on a verified release", label, reason)
            return Lookup(True, reason)
    others = sorted({e["toggleshim"] for e in entries
                     if (e["toggle_optimizer"], e["untoggle_optimizer"]) == (toggle, untoggle)})
    if others:
        return Lookup(False, f"{path} certifies this code for toggleshim {', '.join(others)}, not {version()}: "
                             "certify it again")
    return Lookup(False, f"{path} certifies other toggle code")


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version))


def last_verified(distribution: str) -> str | None:
    """The newest release of ``distribution`` whose toggle code toggleshim verified (``_known.py``)."""
    versions = [r.split(" ", 1)[1] for releases in KNOWN.values() for r in releases
                if r.split(" ", 1)[0] == distribution]
    return max(versions, key=_release_key) if versions else None


def choices(unverified: list[tuple[str, str]], certifiable: bool = True) -> list[tuple[str, str]]:
    """(what to do, its command) for flavours whose code is unverified: ``unverified`` lists their
    (distribution, installed version)."""
    pins = []
    reinstall = False
    for distribution, installed in dict.fromkeys(unverified):
        last = last_verified(distribution)
        if last is not None:
            pins.append(f'"{distribution}=={last}"')
            reinstall = reinstall or last == installed  # the same version, its code changed in place
    found: list[tuple[str, str]] = []
    if pins:
        force = " --force-reinstall --no-deps" if reinstall else ""
        found.append(("pin the last release toggleshim verified", f"pip install{force} {' '.join(pins)}"))
    found.append(("upgrade toggleshim, which may have verified this code since", "pip install --upgrade toggleshim"))
    if certifiable:
        found.append(("certify this Lightning for your project (every property of the check runs on it; it is "
                      "recorded only if all pass)", "python -m toggleshim certify"))
    return found


def choices_sentence(distribution: str, version: str, certifiable: bool = True) -> str:
    """:func:`choices` as one sentence (a warning's)."""
    parts = [f"{what} (`{command}`)" for what, command in choices([(distribution, version)], certifiable)]
    return "Your choices: " + "; ".join(parts[:-1]) + ("; or " if len(parts) > 1 else "") + parts[-1] + "."
