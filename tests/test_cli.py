"""``python -m toggleshim check`` as users run it (issue 13, points 3 and 4): fresh processes, piped and
on a terminal (pty); usage errors exit 2 listing the valid names; a run that checked nothing fails;
no Lightning banners; a progress display that ends exactly at its total; plain help; JSON with rounded
seconds and the example counts that ran; on a new Lightning release the check runs and says whether
its toggle code is verified."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _terminal import run_on_pty

from toggleshim.__main__ import FLAVOURS, PROPERTIES, run_check

TESTS = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), "COLUMNS": "200"}
BANNERS = ("GPU available", "TPU available", "litlogger", "`Trainer.fit` stopped", "Tip:")
CHECK = [sys.executable, "-m", "toggleshim", "check"]
QUICK = ["--examples", "3"]


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300, **kwargs)


def run_many(commands: list[list[str]]) -> list[subprocess.CompletedProcess[str]]:
    """Several fresh processes at once (each pays Python, torch and Lightning start-up)."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for c in commands]
    done = []
    for c, p in zip(commands, procs):
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(c, p.returncode, out, err))
    return done


# usage errors: exit 2, the valid names listed, nothing run


USAGE_ERRORS = [
    (["--property", "no-such-property"], [p.name for p in PROPERTIES]),
    (["--flavour", "lightning"], [*FLAVOURS]),
    (["--examples", "0"], ["at least 1"]),
]


def test_usage_errors_exit_2_and_name_the_valid_choices() -> None:
    procs = run_many([[*CHECK, *args] for args, _ in USAGE_ERRORS])
    for (args, words), proc in zip(USAGE_ERRORS, procs):
        assert proc.returncode == 2, (args, proc)
        assert all(w in proc.stderr for w in words), proc.stderr
        assert "toggleshim check:" not in proc.stdout  # nothing ran


def test_a_run_that_checked_nothing_fails() -> None:
    code = (
        "import sys\n"
        "sys.modules['lightning'] = sys.modules['pytorch_lightning'] = None  # no Lightning importable\n"
        "from toggleshim.__main__ import main\n"
        "sys.exit(main(['check', '--examples', '3']))\n"
    )
    proc = run([sys.executable, "-c", code])
    assert proc.returncode == 1, proc
    assert "nothing was checked" in proc.stdout and "FAILED" in proc.stdout


# piped, in a fresh process, per flavour


@pytest.mark.one_flavour_by_default
def test_flavour_in_a_fresh_process_piped_with_json(flavour: str) -> None:
    proc = run([*CHECK, "--flavour", flavour, *QUICK, "--json", "-"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)  # stdout holds the JSON alone; the report goes to stderr
    assert report["ok"] and report["flavours"] == [flavour]
    assert report["toggle_code"][flavour]["mode"] == "shim"
    props = report["properties"]
    assert [p["prop"] for p in props] == [p.name for p in PROPERTIES] and all(p["verdict"] == "pass" for p in props)
    for p in [*props, report]:
        assert p["seconds"] == round(p["seconds"], 2)
    ran = [p["examples"] for p in props]
    assert all(n > 0 for n in ran)
    assert f"{sum(ran)} examples in" in proc.stderr  # the summary counts what ran, as the JSON does
    # the header says what a property runs, and each line shows what ran: its hand-picked worlds, then
    # the random ones the header announced (the trainer property: a tenth, at least one)
    assert "then 3 random ones (trainer 1, own-methods-trainer 1: each runs a Trainer.fit)" in proc.stderr, proc.stderr
    for p, spec in zip(props, PROPERTIES):
        random = spec.random(3)
        assert p["hand_picked"] == len(spec.hand_picked()) and p["examples"] == p["hand_picked"] + random, p
        assert re.search(rf"{p['prop']}\s+pass\s+{p['hand_picked']} hand-picked \+ {random} random", proc.stderr)
    assert "\r" not in proc.stderr and not any(b in proc.stderr + proc.stdout for b in BANNERS)
    assert "install" not in {p["prop"] for p in props}


def test_check_on_a_terminal_ends_its_progress_at_its_total(tmp_path: Path) -> None:
    """Also: run in the user's project, it leaves nothing there (Hypothesis's files go to the cache)."""
    cache, work = tmp_path / "cache", tmp_path / "project"
    work.mkdir()
    env = {k: v for k, v in ENV.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    rc, out = run_on_pty([*CHECK, "--examples", "5"], cwd=work, env={**env, "XDG_CACHE_HOME": str(cache)})
    assert rc == 0, out
    assert list(work.iterdir()) == []
    assert (cache / "toggleshim" / "hypothesis").is_dir()
    counts = [(int(a), int(b)) for a, b in re.findall(r"\] (\d+)/(\d+) ", out)]
    assert counts and all(done <= total for done, total in counts), counts
    done, total = counts[-1]
    assert done == total
    assert f"{total} examples in" in out  # the bar's total is the number of examples that ran
    assert not any(b in out for b in BANNERS), out
    assert re.search(r"OK: \d+ passed, 0 failed", out)


def test_the_verified_range_is_named_per_distribution(flavour: str) -> None:
    from toggleshim._known import KNOWN
    from toggleshim._patch import _flavours, _status

    mode, why = _status(next(f for f in _flavours() if f.name == flavour))
    assert mode == "shim"
    releases = next(iter(KNOWN.values()))
    for dist in ("lightning", "pytorch-lightning"):
        versions = [r.split()[1] for r in releases if r.split()[0] == dist]
        assert f"{dist} {versions[0]} to {versions[-1]}" in why, why
    assert f"({len(releases)} releases)" in why


def test_a_bad_json_path_is_a_usage_error_before_the_run(tmp_path: Path) -> None:
    missing, directory = run_many([[*CHECK, "--json", str(tmp_path / "no" / "r.json")],
                                   [*CHECK, "--json", str(tmp_path)]])
    assert missing.returncode == directory.returncode == 2, (missing, directory)
    assert "no such directory" in missing.stderr and "is a directory" in directory.stderr
    for proc in (missing, directory):
        assert "Traceback" not in proc.stderr and "toggleshim check:" not in proc.stdout  # nothing ran


def test_a_closed_pipe_ends_the_check_quietly() -> None:
    """``check | head -1``: no traceback, the status of a process the shell saw killed by SIGPIPE."""
    proc = subprocess.Popen([*CHECK, *QUICK], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader goes away
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert first.startswith(b"toggleshim check:"), first
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err


def test_every_usage_line_names_the_program_as_it_was_called() -> None:
    script = str(Path(sys.executable).with_name("toggleshim"))
    module = [sys.executable, "-m", "toggleshim"]
    procs = run_many([[script, "--help"], [script, "check", "--help"], [script, "migrate", "--help"],
                      [*module, "--help"], [*module, "check", "--help"], [*module, "migrate", "--help"],
                      [script, "check", "--examples", "0"], [*module, "migrate"]])
    for proc in procs:
        called = "toggleshim" if proc.args[0] == script else "python -m toggleshim"
        usage = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("usage:")]
        assert usage and all(line.startswith(f"usage: {called} ") for line in usage), (proc.args, usage)
        assert called == "toggleshim" or "usage: toggleshim" not in proc.stdout + proc.stderr


# help


def test_help_has_a_description_and_no_markup() -> None:
    top, sub = run_many([[sys.executable, "-m", "toggleshim", "--help"], [*CHECK, "--help"]])
    assert top.returncode == sub.returncode == 0
    assert "toggle_optimizer" in top.stdout and "check" in top.stdout
    assert "Exit status" in sub.stdout and "Trainer.fit" in sub.stdout and "--property" in sub.stdout
    for text in (top.stdout, sub.stdout):
        assert "``" not in text and ":func:" not in text


# the user's logging is theirs again after the check (the pytest plugin runs it in their session)


def test_run_check_restores_the_logging_levels(flavour: str) -> None:
    import io

    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "pytorch_lightning", "lightning.fabric")]
    before = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.DEBUG)
    try:
        status, report = run_check(2, 0, [flavour], ["trainer"], io.StringIO())
        assert status == 0 and report["properties"][0]["examples"] > 0
        assert [lg.level for lg in loggers] == [logging.DEBUG] * 3
    finally:
        for lg, level in zip(loggers, before):
            lg.setLevel(level)


# a new Lightning release: the check runs and says what the gate made of it

_RELEASE = """
import sys
from _fake_release import FORCE_TRAINABLE, method_copy, relabelled
import {flavour} as pl
if {changed}:
    cls = pl.LightningModule
    cls.toggle_optimizer = method_copy(cls.toggle_optimizer, (FORCE_TRAINABLE,))
with relabelled("2.7.0"):
    from toggleshim.__main__ import main
    sys.exit(main(["check", "--flavour", "{flavour}", "--examples", "10", "--property", "lightning-semantics",
                   "--property", "block-equals-manual"]))
"""


@pytest.mark.one_flavour_by_default
def test_check_on_a_new_release(flavour: str) -> None:
    same, changed = run_many(
        [[sys.executable, "-c", _RELEASE.format(flavour=flavour, changed=c)] for c in (False, True)]
    )
    dist = "lightning" if flavour == "lightning.pytorch" else "pytorch-lightning"
    assert dist + " 2.7.0" in same.stdout and dist + " 2.7.0" in changed.stdout
    assert same.returncode == 0, same.stdout + same.stderr
    assert "toggle code verified" in same.stdout and "OK: 2 passed" in same.stdout
    # its toggle forces toggled parameters trainable: the check shows what differs
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "NOT verified" in changed.stdout and "MISMATCH" in changed.stdout and "trainable" in changed.stdout
    assert "Reproduce with:" in changed.stdout


def test_check_says_why_the_gate_left_a_flavour_alone(flavour: str, monkeypatch: Any) -> None:
    """Someone else's replacement of ``toggle_optimizer``: the gate's verdict (not a warning caught on
    the way) names it, the flavour fails the check and nothing else runs on it."""
    import importlib
    import io

    cls = importlib.import_module(flavour).LightningModule

    def theirs(self: Any, optimizer: Any) -> None:
        return None

    monkeypatch.setattr(cls, "toggle_optimizer", theirs)
    out = io.StringIO()
    status, report = run_check(2, 0, [flavour], ["block-equals-manual"], out)
    assert status == 1
    [result] = report["properties"]
    assert result["prop"] == "install" and result["verdict"] == "FAIL"
    assert "not patched: toggle_optimizer was already replaced by someone else" in result["message"]
    assert result["message"] in out.getvalue()
    assert vars(cls)["toggle_optimizer"] is theirs  # left as found


def test_help_usage_errors_and_migrate_import_no_torch(tmp_path: Path) -> None:
    """What keeps the CLI's answers under half a second (benchmarks/startup.py times them): neither
    torch nor Lightning is imported for help, a usage error or `migrate`."""
    source = tmp_path / "train.py"
    source.write_text(
        "def training_step(self, opt):\n    self.toggle_optimizer(opt)\n    self.untoggle_optimizer(opt)\n"
    )
    module = [sys.executable, "-X", "importtime", "-m", "toggleshim"]
    procs = run_many([[*module, "--help"], [*module, "check", "--help"], [*module, "check", "--examples", "0"],
                      [*module, "migrate", "--help"], [*module, "migrate", str(source)]])
    for proc in procs:
        lines = proc.stderr.splitlines()
        imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}
        assert "toggleshim" in imported, proc.args  # the check looked at something
        assert not {"torch", "lightning", "pytorch_lightning"} & imported, (proc.args, sorted(imported)[:20])
    assert "+    with self.toggle_optimizer(opt, zero_grad=False, step=False):" in procs[-1].stdout  # migrate ran
