"""``toggleshim migrate``: the rewrite on source text, the refusals and their reasons, and the
command as users run it (fresh subprocesses, piped and on a terminal) with bad input.

Training equivalence of every rule is in ``tests/test_migrate_trainer.py`` (real ``Trainer.fit``) and
``property_tests/test_migrate_property.py`` (Hypothesis).
"""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toggleshim import _migrate
from toggleshim._migrate import _run as migrate_run
from toggleshim._migrate import migrate_source


def migrate(src: str) -> tuple[str, list[str]]:
    """(new source, the reasons of the spans not migrated)."""
    result = migrate_source(textwrap.dedent(src).encode())
    reasons = [s.reason for s in result.spans if s.reason is not None] + [r for _, r in result.other]
    return result.new.decode(), reasons


def step(body: str) -> str:
    return "def training_step(self, batch, i):\n    opt = self.optimizers()\n" + textwrap.indent(
        textwrap.dedent(body).strip("\n"), "    "
    ) + "\n"


# -- the rewrite, exactly ------------------------------------------------------------------------

GAN = '''\
"""A GAN."""
import torch  # a comment   with  odd spacing
from lightning.pytorch import LightningModule


class GAN(LightningModule):
    def training_step(self, batch, batch_idx):
        g_opt, d_opt = self.optimizers()   # kept

        # discriminator
        self.toggle_optimizer(d_opt)  # freeze G
        d_opt.zero_grad()
        loss = self.d_loss(batch)   # odd   spacing
        self.manual_backward(loss)
        d_opt.step()  # update D
        self.untoggle_optimizer(d_opt)
        x = [1,
               2]  # untouched
        return x
'''

GAN_MIGRATED = '''\
"""A GAN."""
# toggleshim makes self.toggle_optimizer(...) usable as a with-block
import toggleshim  # noqa: F401
import torch  # a comment   with  odd spacing
from lightning.pytorch import LightningModule


class GAN(LightningModule):
    def training_step(self, batch, batch_idx):
        g_opt, d_opt = self.optimizers()   # kept

        # discriminator
        with self.toggle_optimizer(d_opt):  # freeze G
            loss = self.d_loss(batch)   # odd   spacing
            self.manual_backward(loss)
            # update D
        x = [1,
               2]  # untouched
        return x
'''


def test_migrate_gan_exact_output_comments_and_formatting_kept() -> None:
    new, reasons = migrate(GAN)
    assert new == GAN_MIGRATED
    assert reasons == []


def test_migrate_lines_outside_the_span_byte_for_byte() -> None:
    new, _ = migrate(GAN)
    old_lines, new_lines = GAN.splitlines(keepends=True), new.splitlines(keepends=True)
    span = slice(10, 16)  # the toggle .. untoggle lines (0-based)
    assert old_lines[: span.start] == [ln for ln in new_lines if not ln.startswith(("import toggleshim", "# togg"))][
        : span.start
    ]
    assert old_lines[span.stop :] == new_lines[-3:]


def test_migrate_second_run_changes_nothing() -> None:
    assert migrate(GAN_MIGRATED) == (GAN_MIGRATED, [])


def test_migrate_keeps_crlf_and_encoding() -> None:
    src = b"# -*- coding: latin-1 -*-\r\ndef f(self, o):\r\n    s = '\xe9'\r\n    self.toggle_optimizer(o)\r\n" \
        b"    o.zero_grad()\r\n    o.step()\r\n    self.untoggle_optimizer(o)\r\n"
    new = migrate_source(src).new
    assert b"with self.toggle_optimizer(o):\r\n" in new and b"'\xe9'" in new
    assert new.count(b"\n") == new.count(b"\r\n")


def test_migrate_import_not_added_twice_and_after_docstring() -> None:
    span = step("self.toggle_optimizer(opt)\nself.untoggle_optimizer(opt)")
    new, _ = migrate("from toggleshim import toggle\n" + span)
    assert "import toggleshim  #" not in new and "with self.toggle_optimizer(opt" in new
    new, _ = migrate('"""Doc."""\n' + span)
    assert new.startswith('"""Doc."""\n\n# toggleshim makes') and "F401\n\n\ndef training_step" in new


def test_migrate_flags_and_kept_calls() -> None:
    new, _ = migrate(step("""
        self.toggle_optimizer(opt)
        loss = self.f()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.log("x", loss)
        self.untoggle_optimizer(opt)
    """))
    assert "with self.toggle_optimizer(opt, zero_grad=False, step=False):\n" in new
    assert new.count("opt.zero_grad()") == 1 and new.count("opt.step()") == 1


def test_migrate_step_with_arguments_is_kept() -> None:
    new, _ = migrate(
        step("self.toggle_optimizer(opt)\nopt.zero_grad()\nopt.step(closure)\nself.untoggle_optimizer(opt)")
    )
    assert "with self.toggle_optimizer(opt, step=False):\n        opt.step(closure)\n" in new


def test_migrate_break_in_an_inner_loop_is_fine() -> None:
    new, reasons = migrate(step("""
        self.toggle_optimizer(opt)
        for k in range(3):
            if k:
                break
        else:
            pass
        self.untoggle_optimizer(opt)
    """))
    assert "with self.toggle_optimizer(opt, zero_grad=False, step=False):" in new and not reasons


# -- refusals: untouched, one reason each ---------------------------------------------------------

REFUSED = {
    "return": ("self.toggle_optimizer(opt)\nif i:\n    return\nself.untoggle_optimizer(opt)", "a return between"),
    "break in the loop's else": (
        "for j in x:\n    self.toggle_optimizer(opt)\n    for k in y:\n        pass\n    else:\n        break\n"
        "    self.untoggle_optimizer(opt)",
        "a break between",
    ),
    "continue": ("for j in x:\n    self.toggle_optimizer(opt)\n    continue\n    self.untoggle_optimizer(opt)",
                 "a continue between"),
    "yield": ("self.toggle_optimizer(opt)\nyield 1\nself.untoggle_optimizer(opt)", "a yield between"),
    "await": ("self.toggle_optimizer(opt)\nawait f()\nself.untoggle_optimizer(opt)", "an await between"),
    "conditional untoggle": ("self.toggle_optimizer(opt)\nif i:\n    self.untoggle_optimizer(opt)",
                             "a conditional untoggle (line 5"),
    "toggle and untoggle in two branches": (
        "if i:\n    self.toggle_optimizer(opt)\nelse:\n    self.untoggle_optimizer(opt)",
        "no untoggle_optimizer follows it in the same block",
    ),
    "overlapping toggles": (
        "self.toggle_optimizer(a)\nself.toggle_optimizer(b)\nself.untoggle_optimizer(b)\nself.untoggle_optimizer(a)",
        "another statement toggle (line 4) opens before its untoggle",
    ),
    "another optimizer untoggled": ("self.toggle_optimizer(a)\nself.untoggle_optimizer(b)",
                                    "not given the same optimizer expression"),
    "another receiver": ("self.toggle_optimizer(a)\nother.untoggle_optimizer(a)", "called on another object"),
    "a call as the optimizer": ("self.toggle_optimizer(self.optimizers()[0])\n"
                                "self.untoggle_optimizer(self.optimizers()[0])", "may not be the same object"),
    "the optimizer rebound": ("self.toggle_optimizer(opt)\nopt = other\nself.untoggle_optimizer(opt)",
                              "`opt` is rebound"),
    "an attribute prefix rebound": ("self.toggle_optimizer(self.h.opt)\nself.h = other\n"
                                    "self.untoggle_optimizer(self.h.opt)", "`self.h` is rebound"),
    "the list indexed changed": ("self.toggle_optimizer(opts[0])\nopts.reverse()\nself.untoggle_optimizer(opts[0])",
                                 "`opts`, which the optimizer is taken from"),
    "setattr": ("self.toggle_optimizer(self.o)\nsetattr(self, 'o', x)\nself.untoggle_optimizer(self.o)", "`setattr`"),
    "flags already given": ("self.toggle_optimizer(opt, zero_grad=False)\nself.untoggle_optimizer(opt)",
                            "already given zero_grad=/step="),
    "inside a block": ("with self.toggle_optimizer(a):\n    self.toggle_optimizer(opt)\n"
                       "    self.untoggle_optimizer(opt)", "inside the toggle block at line 3"),
    "a shared line": ("self.toggle_optimizer(opt); opt.zero_grad()\nself.untoggle_optimizer(opt)",
                      "shares its line with other statements"),
    "result used": ("t = self.toggle_optimizer(opt)\nself.untoggle_optimizer(opt)",
                    "the result of toggle_optimizer is used"),
    "already exception-safe": ("self.toggle_optimizer(opt)\ntry:\n    f()\nfinally:\n    self.untoggle_optimizer(opt)",
                               "already exception-safe"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_migrate_refuses_with_a_reason(case: str) -> None:
    body, reason = REFUSED[case]
    src = step(body)
    if "await" in body:
        src = "async " + src
    new, reasons = migrate(src)
    assert new == src  # untouched, byte for byte
    assert any(reason in r for r in reasons), reasons


def test_migrate_overlapping_spans_never_become_nested_blocks() -> None:
    src = step("""
        self.toggle_optimizer(a)
        a.zero_grad()
        self.toggle_optimizer(b)
        b.zero_grad()
        b.step()
        self.untoggle_optimizer(b)
        a.step()
        self.untoggle_optimizer(a)
    """)
    new, reasons = migrate(src)
    assert new == src and len(reasons) == 2
    assert "inside the span of the statement toggle at line 3" in reasons[1]


def test_migrate_class_with_its_own_toggle_optimizer_goes_through_toggleshim_toggle() -> None:
    """An override that returns None (here: never calls super) cannot be a with target; the block is
    ``toggleshim.toggle``'s (more in tests/test_migrate_overrides.py)."""
    src = "class M:\n    def toggle_optimizer(self, o):\n        pass\n\n" + textwrap.indent(
        step("self.toggle_optimizer(opt)\nself.untoggle_optimizer(opt)"), "    ")
    new, reasons = migrate(src)
    assert "with toggleshim.toggle(self, opt, zero_grad=False, step=False):" in new and not reasons
    assert new.startswith("import toggleshim\n\n\nclass M:")


# -- the command, in fresh subprocesses ----------------------------------------------------------

def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toggleshim", "migrate", *args], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=120)


def run_here(*args: str, cwd: Path, monkeypatch: pytest.MonkeyPatch,
             capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess[str]:
    """The command in this process (each subprocess imports torch: ~4 s; these cases need no fresh one)."""
    monkeypatch.chdir(cwd)
    code = _migrate.main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "gan.py").write_text(GAN)
    (tmp_path / "pkg" / "plain.py").write_text("x = 1\n")
    (tmp_path / "pkg" / ".hidden").mkdir()
    (tmp_path / "pkg" / ".hidden" / "skip.py").write_text(GAN)
    return tmp_path


def test_cli_diff_is_the_default_and_writes_nothing(project: Path) -> None:
    (project / "pkg" / "broken.py").write_text("def f(:\n    pass\n")
    r = run("pkg", cwd=project)
    assert r.returncode == 1, r.stderr  # the file that does not parse; the others are processed
    assert "pkg/broken.py:1:7: skipped: cannot parse: invalid syntax" in r.stderr
    assert r.stdout.startswith("--- pkg/gan.py\n+++ pkg/gan.py\n")
    assert "+        with self.toggle_optimizer(d_opt):" in r.stdout
    assert "would rewrite 1 of 3 files (1 span); 1 could not be processed" in r.stderr
    assert "skip.py" not in r.stdout + r.stderr
    assert (project / "pkg" / "gan.py").read_text() == GAN
    # the diff applies: patch(1) turns the file into the migrated text
    patched = subprocess.run(["patch", "-p0"], input=r.stdout, cwd=project, capture_output=True, text=True)
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert (project / "pkg" / "gan.py").read_text() == GAN_MIGRATED


def test_cli_write_then_check(project: Path) -> None:
    gan = project / "pkg" / "gan.py"
    gan.chmod(0o640)
    r = run("--check", "pkg", cwd=project)
    assert r.returncode == 1
    assert r.stdout == ("pkg/gan.py:11: `self.toggle_optimizer(d_opt)` as a statement: an exception before its "
                        "untoggle leaves the optimizers toggled; `toggleshim migrate` rewrites it\n")
    r = run("--write", "pkg", cwd=project)
    assert r.returncode == 0 and "pkg/gan.py: migrated 1 span" in r.stderr
    assert gan.read_text() == GAN_MIGRATED and (gan.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in gan.parent.iterdir()) == [".hidden", "gan.py", "plain.py"]  # no temp left
    r = run("--check", "pkg", cwd=project)
    assert (r.returncode, r.stdout) == (0, "")


def test_cli_check_reports_what_cannot_be_migrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.py").write_text(step(REFUSED["return"][0]) + step(REFUSED["already exception-safe"][0]))
    r = run_here("--check", "m.py", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        "m.py:3: `self.toggle_optimizer(opt)` as a statement: an exception before its untoggle leaves the "
        "optimizers toggled; not migrated: a return between the toggle and the untoggle (a block would step and "
        "untoggle there)"
    ]


_STEPS_INSIDE = """\
import toggleshim
from lightning.pytorch import LightningModule


class M(LightningModule):
    def training_step(self, batch, batch_idx):
        opt, other = self.optimizers()
        with self.toggle_optimizer(opt):
            self.manual_backward(self(batch).sum())
            opt.step()
        with self.toggle_optimizer(opt, step=False):
            opt.step()
        with toggleshim.toggle(self, opt) as o:
            other.step()
            o.step()
        first = batch_idx % 2 == 0
        with self.toggle_optimizer(opt, step=first):
            opt.step(closure=None)
"""


def test_cli_check_flags_a_step_inside_a_block_that_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 44, point 3: a step of the block's own optimizer (its expression, or its ``as`` name) inside a
    block that steps on exit is a finding with its line and the fix, exit 1; ``step=False`` and another
    optimizer's step are not; a non-literal flag steps when it is true."""
    (tmp_path / "m.py").write_text(_STEPS_INSIDE)
    r = run_here("--check", "m.py", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert r.returncode == 1
    fix = ("the optimizer would step twice (toggleshim raises a RuntimeError at the block's exit instead); pass "
           "step=False to keep this call, or drop it and let the block step")
    assert r.stdout.splitlines() == [
        f"m.py:10: `opt.step()` inside `with self.toggle_optimizer(opt):` (line 8), which steps on exit: {fix}",
        f"m.py:15: `o.step()` inside `with toggleshim.toggle(self, opt):` (line 13), which steps on exit: {fix}",
        "m.py:18: `opt.step(closure=None)` inside `with self.toggle_optimizer(opt, step=first):` (line 17), which "
        f"steps on exit (step=first: when `first` is true): {fix}",
    ]
    assert "3 steps inside a block that steps on exit" in r.stderr
    fixed = _STEPS_INSIDE.replace("            opt.step()\n        with self.toggle_optimizer(opt, step=False)",
                                  "        with self.toggle_optimizer(opt, step=False)")
    fixed = fixed.replace("            o.step()\n", "").replace("step=first):\n            opt.step(closure=None)",
                                                              "step=False):\n            opt.step(closure=None)")
    (tmp_path / "m.py").write_text(fixed)
    r = run_here("--check", "m.py", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert (r.returncode, r.stdout) == (0, ""), r.stdout


def test_cli_not_migrated_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.py").write_text(step(REFUSED["return"][0]))
    r = run_here("m.py", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert (r.returncode, r.stdout) == (0, "")
    assert r.stderr.splitlines()[0] == (
        "m.py:3: not migrated: a return between the toggle and the untoggle (a block would step and untoggle there)"
    )


def test_cli_undecodable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.py").write_bytes(b'x = "\xff"\n')
    r = run_here("bad.py", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert r.returncode == 1 and "bad.py: skipped: cannot decode" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.py"], "missing.py: no such file or directory"),
        (["notes.txt"], "notes.txt: not a Python file"),
        (["empty"], "empty: no Python files under this directory"),
        (["x.py"], "x.py: no Python files under this directory"),  # a directory named like a file
        ([], "the following arguments are required: PATH"),
        (["--write", "--check", "ok.py"], "not allowed with argument"),
        (["--frobnicate", "ok.py"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_cli_usage_errors_exit_2_and_change_nothing(tmp_path: Path, args: list[str], message: str,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("hi\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "x.py").mkdir()
    (tmp_path / "ok.py").write_text(GAN)
    r = run_here(*args, cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert r.stdout == "" and (tmp_path / "ok.py").read_text() == GAN


def test_cli_bad_paths_among_good_ones_change_nothing(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text(GAN)
    (tmp_path / "notes.txt").write_text("hi\n")
    r = run("--write", "ok.py", "missing.py", "notes.txt", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "" and (tmp_path / "ok.py").read_text() == GAN
    assert r.stderr == (
        "toggleshim migrate: missing.py: no such file or directory\n"
        "notes.txt: not a Python file (expected a .py file or a directory)\nnothing was changed\n"
    )


def test_cli_without_libcst_says_how_to_install(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text(GAN)
    code = "import sys; sys.modules['libcst'] = None; from toggleshim.__main__ import main; sys.exit(main())"
    r = subprocess.run([sys.executable, "-c", code, "migrate", "ok.py"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr == 'toggleshim migrate: LibCST is not installed: pip install "toggleshim[migrate]"\n'
    assert r.stderr.count("toggleshim migrate") == 1  # one prefix (issue 38)
    code = "import sys; sys.modules['libcst'] = None; from toggleshim._migrate import migrate_source"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stderr.splitlines()[-1] == (
        'ImportError: toggleshim migrate: LibCST is not installed: pip install "toggleshim[migrate]"'
    )


def test_cli_console_script_and_help(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("toggleshim")
    r = subprocess.run([str(script), "migrate", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--check" in r.stdout and "provably equivalent" in r.stdout


def test_cli_on_a_terminal(project: Path) -> None:
    """Run on a pty (as a user at a terminal): the same output and exit code."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.chdir(project)
        os.execv(sys.executable, [sys.executable, "-m", "toggleshim", "migrate", "--check", "pkg"])
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1
    assert b"pkg/gan.py:11: `self.toggle_optimizer(d_opt)` as a statement" in out


# -- unreadable files and failed writes (in process: monkeypatch) --------------------------------

def test_unreadable_file_reported_others_processed(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    real = migrate_run._read

    def read(path: str) -> bytes:
        if path.endswith("plain.py"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(migrate_run, "_read", read)
    monkeypatch.chdir(project)
    assert _migrate.main(["--write", "pkg"]) == 1
    err = capsys.readouterr().err
    assert "pkg/plain.py: skipped: cannot read: Permission denied" in err and "1 could not be processed" in err
    assert (project / "pkg" / "gan.py").read_text() == GAN_MIGRATED


@pytest.mark.parametrize("mode", ["--write", "--check"])
def test_analysis_failing_for_one_file_skips_it_and_goes_on(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], mode: str) -> None:
    """Whatever else stops the analysis of one file (here: an error planted in it) is that file's
    `skipped: cannot analyse: <error>`; the files after it are processed; exit 1 (docs/migrate.md)."""
    first = project / "pkg" / "a_first.py"  # processed before gan.py (sorted)
    first.write_text(GAN)
    real = migrate_run._migrate_parsed

    def analyse(parsed: _migrate._Parsed, *args: object, **kwargs: object) -> _migrate._FileResult:
        if parsed.path.endswith("a_first.py"):
            raise RuntimeError("planted")
        return real(parsed, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(migrate_run, "_migrate_parsed", analyse)
    r = run_here(mode, "pkg", cwd=project, monkeypatch=monkeypatch, capsys=capsys)
    assert r.returncode == 1
    assert r.stderr.startswith("pkg/a_first.py: skipped: cannot analyse: RuntimeError: planted\n"), r.stderr
    assert first.read_text() == GAN
    if mode == "--write":
        assert (project / "pkg" / "gan.py").read_text() == GAN_MIGRATED
        assert r.stderr.endswith("toggleshim migrate: rewrote 1 of 3 files (1 span); 1 could not be processed "
                                 "(see above)\n"), r.stderr
    else:
        assert r.stdout.startswith("pkg/gan.py:11: `self.toggle_optimizer(d_opt)` as a statement"), r.stdout
        assert r.stderr.endswith("toggleshim migrate --check: 1 statement toggle not exception-safe in 2 files "
                                 "checked; 1 could not be processed (see above)\n"), r.stderr


@pytest.mark.parametrize("fail_at", ["write", "replace"])
def test_write_failing_midway_leaves_the_file_whole(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], fail_at: str) -> None:
    gan = project / "pkg" / "gan.py"
    if fail_at == "replace":
        def replace(src: str, dst: str) -> None:
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(os, "replace", replace)
    else:
        real_fdopen = os.fdopen

        class HalfFile:
            def __init__(self, fh: object) -> None:
                self.fh = fh

            def __enter__(self) -> HalfFile:
                return self

            def __exit__(self, *exc: object) -> None:
                self.fh.close()  # type: ignore[attr-defined]

            def write(self, data: bytes) -> None:
                self.fh.write(data[: len(data) // 2])  # type: ignore[attr-defined]
                raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fdopen", lambda fd, mode: HalfFile(real_fdopen(fd, mode)))
    monkeypatch.chdir(project)
    assert _migrate.main(["--write", "pkg"]) == 1
    assert "pkg/gan.py: skipped: cannot write: No space left on device (left unchanged)" in capsys.readouterr().err
    assert gan.read_text() == GAN
    assert sorted(p.name for p in gan.parent.iterdir()) == [".hidden", "gan.py", "plain.py"]


def test_write_through_a_symlink_keeps_the_link(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    link = project / "link.py"
    link.symlink_to(project / "pkg" / "gan.py")
    monkeypatch.chdir(project)
    assert _migrate.main(["--write", "link.py"]) == 0
    assert link.is_symlink() and (project / "pkg" / "gan.py").read_text() == GAN_MIGRATED


# -- issue 26, point 2: inert by allow-list ---------------------------------------------------------

# A line between the toggle and `opt.zero_grad()`: the zero_grad is taken over only when every such
# line is inert (it can run no user code, read no state, raise nothing).
NOT_INERT = {
    "an f-string": 'tag = f"{spy}"',
    "implicit concatenation holding an f-string": 'tag = ("a: " f"{self.net.weight.grad}")',
    "an f-string in a format spec": 'tag = f"{0:{spy}}"',
    "a bare f-string": 'f"{spy}"',
    "an f-string inside a tuple display": 'tag = (1, f"{spy}")',
    "an f-string inside a list display": 'tag = ["a", f"{spy!r}"]',
    "tuple unpacking of a name (runs __iter__)": "a, b = spy",
    "list unpacking of a name": "[a, b] = spy",
    "starred unpacking": "a, *b = spy",
    "unpacking a display of another length": "a, b = 1, 2, 3",
    "a name read (may be unbound; reads state)": "tag = spy",
    "an attribute (may be a property)": "tag = spy.value",
    "a subscript": "tag = spy[0]",
    "a comparison": "tag = spy == 1",
    "an operator": "tag = spy + 0",
    "not": "tag = not spy",
    "a call": "spy()",
    "a tuple holding a name": "tag = (1, spy)",
    "an attribute target": "self.tag = 1",
    "an annotated assignment": "tag: int = 1",
    "del": "del spy",
}
INERT_LINES = {
    "pass": "pass",
    "a number": "1",
    "a string": '"note"',
    "implicit concatenation of plain strings": 'tag = ("a: " "b")',
    "bytes": 'tag = b"x"',
    "a signed number": "tag = -1.5",
    "constants": "tag = None; done = True",
    "a tuple of literals unpacked into names": "a, (b, c) = 1, (2, ...)",
    "a chain": "a = b = 1",
}


@pytest.mark.parametrize("form", list(NOT_INERT))
def test_migrate_line_that_may_run_user_code_keeps_zero_grad(form: str) -> None:
    new, reasons = migrate(step(f"self.toggle_optimizer(opt)\n{NOT_INERT[form]}\nopt.zero_grad()\nopt.step()\n"
                                "self.untoggle_optimizer(opt)"))
    assert not reasons and "with self.toggle_optimizer(opt, zero_grad=False):\n" in new, new
    assert "opt.zero_grad()" in new


@pytest.mark.parametrize("form", list(NOT_INERT))
def test_migrate_line_that_may_run_user_code_keeps_step(form: str) -> None:
    new, reasons = migrate(step(f"self.toggle_optimizer(opt)\nopt.zero_grad()\nopt.step()\n{NOT_INERT[form]}\n"
                                "self.untoggle_optimizer(opt)"))
    assert not reasons and "with self.toggle_optimizer(opt, step=False):\n" in new, new


@pytest.mark.parametrize("form", list(INERT_LINES))
def test_migrate_inert_line_lets_zero_grad_and_step_move(form: str) -> None:
    line = INERT_LINES[form]
    new, reasons = migrate(step(f"self.toggle_optimizer(opt)\n{line}\nopt.zero_grad()\nopt.step()\n{line}\n"
                                "self.untoggle_optimizer(opt)"))
    assert not reasons and "with self.toggle_optimizer(opt):\n" in new, new


def test_migrate_binding_at_module_level_is_not_inert() -> None:
    """At module level a name is a global an optimizer's step may read: binding it is not inert."""
    new, _ = migrate("m.toggle_optimizer(opt)\nopt.zero_grad()\nopt.step()\ntag = 1\nm.untoggle_optimizer(opt)\n")
    assert "with m.toggle_optimizer(opt, step=False):\n" in new
    new, _ = migrate("m.toggle_optimizer(opt)\nopt.zero_grad()\nopt.step()\npass\nm.untoggle_optimizer(opt)\n")
    assert "with m.toggle_optimizer(opt):\n" in new


# -- issue 26, point 3: every binding form rebinding the optimizer or the receiver -----------------

# form -> a span body that rebinds `opt` (or `self`, or the list `opts[0]` is taken from) that way
BINDING_FORMS = {
    "assignment": "opt = other",
    "chained assignment": "a = opt = other",
    "tuple target": "a, opt = pair",
    "list target": "[a, opt] = pair",
    "starred target": "*opt, a = xs",
    "nested target": "(a, (b, opt)) = nested",
    "augmented assignment": "opt += other",
    "annotated assignment": "opt: Any = other",
    "annotation alone (makes it local)": "opt: Any",
    "for target": "for opt in xs:\n    pass",
    "for tuple target": "for a, opt in pairs:\n    pass",
    "with ... as": "with ctx() as opt:\n    pass",
    "with ... as (tuple)": "with ctx() as (a, opt):\n    pass",
    "except ... as": "try:\n    f()\nexcept ValueError as opt:\n    pass",
    "except* ... as": "try:\n    f()\nexcept* ValueError as opt:\n    pass",
    "walrus": "if (opt := other):\n    pass",
    "walrus in a comprehension (binds outside it)": "xs = [(opt := y) for y in ys]",
    "import": "import opt",
    "import dotted (binds the first name)": "import opt.sub",
    "import as": "import other as opt",
    "from import": "from helpers import opt",
    "from import as": "from helpers import other as opt",
    "del": "del opt",
    "match capture": "match x:\n    case opt:\n        pass",
    "match as": "match x:\n    case [1, 2] as opt:\n        pass",
    "match sequence": "match x:\n    case [opt, 1]:\n        pass",
    "match star": "match x:\n    case [a, *opt]:\n        pass",
    "match mapping value": "match x:\n    case {'k': opt}:\n        pass",
    "match mapping rest": "match x:\n    case {**opt}:\n        pass",
    "match class positional": "match x:\n    case Point(opt, 1):\n        pass",
    "match class keyword": "match x:\n    case Point(x=opt):\n        pass",
    "match or-pattern": "match x:\n    case [opt] | (opt, 1):\n        pass",
    "match guard walrus": "match x:\n    case [a] if (opt := a):\n        pass",
    "def": "def opt():\n    pass",
    "async def": "async def opt():\n    pass",
    "decorated def": "@wrap\ndef opt():\n    pass",
    "class": "class opt:\n    pass",
    "nested def binding it (may be nonlocal)": "def swap():\n    nonlocal opt\n    opt = other",
    # `async for`/`async with` in the span itself are refused first as awaits (rule 9: the next test)
    "async for target (nested async def)": "async def swap():\n    nonlocal opt\n    async for opt in xs:\n"
                                           "        pass",
    "async with ... as (nested async def)": "async def swap():\n    nonlocal opt\n    async with ctx() as opt:\n"
                                            "        pass",
    "type alias": "type opt = int",
}


@pytest.mark.parametrize("form", list(BINDING_FORMS))
def test_migrate_refuses_every_binding_form(form: str) -> None:
    src = step(f"self.toggle_optimizer(opt)\n{BINDING_FORMS[form]}\nself.untoggle_optimizer(opt)")
    new, reasons = migrate(src)
    assert new == src
    assert len(reasons) == 1 and "`opt` is rebound between the toggle and the untoggle" in reasons[0], reasons


# in an `async def` training_step, the span itself: each awaits (rule 9), so none is migrated
ASYNC_BINDING_FORMS = {
    "async for": "async for opt in xs:\n    pass",
    "async with ... as": "async with ctx() as opt:\n    pass",
    "async comprehension": "ys = [opt async for opt in xs]",
}


@pytest.mark.parametrize("form", list(ASYNC_BINDING_FORMS))
def test_migrate_refuses_async_binding_forms(form: str) -> None:
    src = "async " + step(f"self.toggle_optimizer(opt)\n{ASYNC_BINDING_FORMS[form]}\nself.untoggle_optimizer(opt)")
    new, reasons = migrate(src)
    assert new == src
    assert reasons == ["an async loop or block (it awaits) between the toggle and the untoggle (a block would step "
                       "and untoggle there)"], reasons


def test_migrate_async_comprehension_target_rebinds_nothing_outside() -> None:
    """Like a comprehension's `for opt in`, an `async for opt in` of one is its own scope (here in a
    nested `async def`, where rule 9 does not look): the span is migrated."""
    new, reasons = migrate(step("self.toggle_optimizer(opt)\nasync def g():\n    return [opt async for opt in xs]\n"
                                "self.untoggle_optimizer(opt)"))
    assert not reasons and "with self.toggle_optimizer(opt, zero_grad=False, step=False):" in new


# parameters and type parameters (PEP 695, Python 3.12 syntax: LibCST parses it on any Python) are
# the nested function's, class's or alias's own scope: they rebind nothing in the span
PARAMETER_FORMS = {
    "lambda parameter": "f = lambda opt: opt",
    "lambda *args, **kwargs, default": "f = lambda a=1, *opt, **self: a",
    "def parameters": "def g(self, opt, /, *args, k=1, **kw):\n    return opt",
    "def keyword-only and ** parameter": "def g(*, opt):\n    pass\ndef h(**opt):\n    pass",
    "def type parameter": "def g[opt]():\n    pass",
    "def TypeVarTuple and ParamSpec": "def g[*opt, **self]():\n    pass",
    "class type parameter": "class C[opt]:\n    pass",
    "type alias type parameter": "type Pair[opt] = tuple[opt, opt]",
}


@pytest.mark.parametrize("form", list(PARAMETER_FORMS))
def test_migrate_lambda_and_type_params_rebind_nothing(form: str) -> None:
    new, reasons = migrate(step(f"self.toggle_optimizer(opt)\n{PARAMETER_FORMS[form]}\nself.untoggle_optimizer(opt)"))
    assert not reasons and "with self.toggle_optimizer(opt, zero_grad=False, step=False):" in new, reasons


@pytest.mark.parametrize(
    "form", ["self = other", "for self in xs:\n    pass", "match x:\n    case {**self}:\n        pass"]
)
def test_migrate_refuses_a_rebound_receiver(form: str) -> None:
    src = step(f"self.toggle_optimizer(opt)\n{form}\nself.untoggle_optimizer(opt)")
    new, reasons = migrate(src)
    assert new == src and "`self` is rebound" in reasons[0], reasons


def test_migrate_refuses_star_import_in_a_span() -> None:
    src = "m.toggle_optimizer(opt)\nfrom helpers import *\nm.untoggle_optimizer(opt)\n"  # valid at module level
    new, reasons = migrate(src)
    assert new == src and reasons == [
        "`from helpers import *` between the toggle and the untoggle may rebind any name"
    ]


def test_migrate_refuses_a_name_declared_global_elsewhere() -> None:
    """A function declaring `global opt` can rebind it when called from the span (no binding visible)."""
    src = "def swap():\n    global opt\n    opt = other\n\n\nm.toggle_optimizer(opt)\nswap()\n" \
        "m.untoggle_optimizer(opt)\n"
    new, reasons = migrate(src)
    assert new == src and reasons == [
        "`opt` is declared global at line 2: a function called between the toggle and the untoggle may rebind it"
    ]


def test_migrate_refuses_a_name_declared_nonlocal_before_the_span() -> None:
    src = step("""
        def swap():
            nonlocal opt
            opt = other
        self.toggle_optimizer(opt)
        swap()
        self.untoggle_optimizer(opt)
    """)
    new, reasons = migrate(src)
    assert new == src and reasons == [
        "`opt` is declared nonlocal at line 4: a function called between the toggle and the untoggle may rebind it"
    ]


def test_migrate_comprehension_target_rebinds_nothing_outside() -> None:
    """A comprehension's `for opt in` is its own scope: the span is migrated (no over-refusal)."""
    new, reasons = migrate(step("self.toggle_optimizer(opt)\nxs = [opt for opt in ys]\nself.untoggle_optimizer(opt)"))
    assert not reasons and "with self.toggle_optimizer(opt, zero_grad=False, step=False):" in new


def test_migrate_subscript_forms_of_the_indexed_list() -> None:
    for form in ("opts[1] = other", "del opts[0]", "opts[:] = other", "for opts[0] in xs:\n    pass"):
        src = step(f"self.toggle_optimizer(opts[0])\n{form}\nself.untoggle_optimizer(opts[0])")
        new, reasons = migrate(src)
        assert new == src and "is rebound" in reasons[0], (form, reasons)


# -- issue 26, point 5: where the import goes, comments, refusal reasons ---------------------------

SPAN = step("self.toggle_optimizer(opt)\nopt.zero_grad()\nopt.step()\nself.untoggle_optimizer(opt)")
IMPORT = "# toggleshim makes self.toggle_optimizer(...) usable as a with-block\nimport toggleshim  # noqa: F401\n"

# the file's imports -> the same with `import toggleshim` where isort/ruff's default sections put it
IMPORT_PLACES = {
    "third-party section before first-party": (
        "import os\n\nimport numpy as np\nimport torch\nfrom lightning import LightningModule\n\nfrom pkg import b\n",
        "import os\n\nimport numpy as np\n\n" + IMPORT + "import torch\nfrom lightning import LightningModule\n\n"
        "from pkg import b\n",
    ),
    "stdlib and first-party only: a section of its own": (
        "import os\n\nfrom pkg import b\n",
        "import os\n\n" + IMPORT + "\nfrom pkg import b\n",
    ),
    "first-party only": ("from pkg import b\n", IMPORT + "\nfrom pkg import b\n"),
    "relative only": ("from . import b\n", IMPORT + "\nfrom . import b\n"),
    "future and stdlib": (
        "from __future__ import annotations\n\nimport os\n",
        "from __future__ import annotations\n\nimport os\n\n" + IMPORT,
    ),
    "after every third-party straight import, before the from imports": (
        "import numpy\nimport pandas\nfrom lightning import LightningModule\n",
        "import numpy\nimport pandas\n\n" + IMPORT + "from lightning import LightningModule\n",
    ),
    "after a docstring": ('"""Doc."""\n\nimport torch\n', '"""Doc."""\n\n' + IMPORT + "import torch\n"),
}


def _project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "b.py").write_text("")
    return tmp_path


@pytest.mark.parametrize("case", list(IMPORT_PLACES))
def test_migrate_import_goes_in_the_third_party_section(tmp_path: Path, case: str) -> None:
    before, after = IMPORT_PLACES[case]
    path = _project(tmp_path) / "pkg" / "m.py"
    new = migrate_source((before + "\n\n" + SPAN).encode(), str(path)).new.decode()
    assert new.startswith(after + "\n\n"), new


# a file with no imports: what stands above the def -> what stands above it migrated
NO_IMPORTS = {
    "": IMPORT + "\n\n",
    '"""Doc."""\n\n\n': '"""Doc."""\n\n' + IMPORT + "\n\n",  # four blank lines before the def, until issue 38
    '"""Doc."""\n': '"""Doc."""\n\n' + IMPORT + "\n\n",
    "# a comment\n\n\n": "# a comment\n\n\n" + IMPORT + "\n\n",
}


@pytest.mark.parametrize("top", list(NO_IMPORTS))
def test_migrate_import_into_a_file_without_imports_leaves_two_blank_lines_before_a_def(top: str) -> None:
    """No imports: ``import toggleshim`` goes at the top (after the docstring), and the ``def`` has two
    blank lines before it, as it had: not two more."""
    new, _ = migrate(top + SPAN)
    assert new.startswith(NO_IMPORTS[top] + "def training_step"), new


def test_migrate_import_order_passes_ruff(tmp_path: Path) -> None:
    """What ruff's own import sorting (I001, default settings) says of the migrated files."""
    project = _project(tmp_path)
    for n, (before, _) in enumerate(IMPORT_PLACES.values()):
        path = project / "pkg" / f"m{n}.py"
        path.write_text(before + "\n\n" + SPAN)
        path.write_bytes(migrate_source(path.read_bytes(), str(path)).new)
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--select", "I", "pkg"], cwd=project,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_migrate_import_placement_does_not_depend_on_the_working_directory(tmp_path: Path) -> None:
    """Without a project marker, first-party is decided by the tree (the directory holding the file's
    top-level package), not the current directory (issue 38): the same tree, migrated from inside it
    and from elsewhere, gives byte-identical output. ``models`` is a module of the tree, so
    ``import toggleshim`` goes between ``numpy`` and it (were ``models`` third-party: after it)."""
    tree, elsewhere = tmp_path / "tree", tmp_path / "elsewhere"
    tree.mkdir(), elsewhere.mkdir()
    assert not [p for p in (tree, *tree.parents) for m in ("pyproject.toml", "setup.py", "setup.cfg", ".git")
                if (p / m).exists()], "a project marker above the tree: it would be the root"
    (tree / "train.py").write_text("import numpy\n\nimport models\n\n\n" + SPAN)
    (tree / "models.py").write_text("")
    outs = [run("--diff", str(tree), cwd=cwd) for cwd in (tree, elsewhere, Path(os.sep))]
    assert all(r.returncode == 0 for r in outs) and outs[0].stdout
    assert outs[0].stdout == outs[1].stdout == outs[2].stdout
    assert f"--- {tree}/train.py\n" in outs[0].stdout
    expected = "import numpy\n\n" + IMPORT + "\nimport models\n"
    assert migrate_source((tree / "train.py").read_bytes(), str(tree / "train.py")).new.decode().startswith(expected)
    for cwd in (tree, elsewhere):
        copy = tmp_path / f"copy-{cwd.name}"
        shutil.copytree(tree, copy)
        assert run("--write", str(copy), cwd=cwd).returncode == 0
    assert (tmp_path / "copy-tree" / "train.py").read_bytes() == (tmp_path / "copy-elsewhere" / "train.py").read_bytes()
    assert (tmp_path / "copy-tree" / "train.py").read_text().startswith(expected)


def test_migrate_import_not_added_when_the_file_imports_toggleshim() -> None:
    for line in ("import toggleshim\n", "import toggleshim.testing\n", "from toggleshim import toggle\n"):
        new, _ = migrate(line + "\n\n" + SPAN)
        assert new.count("toggleshim") == 1 and "with self.toggle_optimizer(opt):" in new


def test_migrate_untoggle_comments_stay_after_the_block() -> None:
    new, _ = migrate(step("""
        # train D
        self.toggle_optimizer(opt)  # freeze G
        opt.zero_grad()
        loss.backward()
        # the step
        opt.step()  # update D
        # unfreeze G
        self.untoggle_optimizer(opt)  # done with D
        self.log("x", 1)
    """))
    assert new.endswith(
        "    # train D\n"
        "    with self.toggle_optimizer(opt):  # freeze G\n"
        "        loss.backward()\n"
        "        # the step\n"
        "        # update D\n"
        "    # unfreeze G\n"
        "    # done with D\n"
        '    self.log("x", 1)\n'
    ), new


def test_migrate_untoggle_comments_at_the_end_of_a_block_stay_outside() -> None:
    new, _ = migrate(step("self.toggle_optimizer(opt)\nloss.backward()\n# unfreeze\nself.untoggle_optimizer(opt)"))
    assert new.endswith("    with self.toggle_optimizer(opt, zero_grad=False, step=False):\n"
                        "        loss.backward()\n    # unfreeze\n"), new
    assert migrate(new)[0] == new


def test_migrate_untoggle_comment_before_the_next_span() -> None:
    body = "self.toggle_optimizer(a)\nf()\nself.untoggle_optimizer(a)  # a done\nself.toggle_optimizer(b)\n" \
        "g()\nself.untoggle_optimizer(b)\n"
    new, _ = migrate(step(body))
    assert "        f()\n    # a done\n    with self.toggle_optimizer(b, " in new, new


def test_migrate_lightning_1_two_argument_toggle_has_its_own_reason() -> None:
    new, reasons = migrate(src := step("""
        self.toggle_optimizer(opt, optimizer_idx)
        opt.zero_grad()
        opt.step()
        self.untoggle_optimizer(optimizer_idx)
    """))
    assert new == src and reasons == [
        "`toggle_optimizer(optimizer, optimizer_idx)` is Lightning 1.x's form (its untoggle_optimizer takes the "
        "index); the block needs Lightning >= 2.0, where toggle_optimizer takes the optimizer alone"
    ]


# -- issue 26, points 4 and 5: the command, in fresh subprocesses ----------------------------------

DEEP = "x = " + " + ".join(["1"] * 400) + "\n"  # valid Python that LibCST's recursive walk cannot handle


def test_cli_one_file_never_stops_the_run(project: Path) -> None:
    (project / "pkg" / "a_deep.py").write_text(DEEP)  # processed first (sorted)
    compile(DEEP, "a_deep.py", "exec")  # valid
    r = run("pkg", cwd=project)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("pkg/a_deep.py: skipped: LibCST cannot handle this file: an expression or block nested "
                               "too deeply for its recursive walk (RecursionError: "), r.stderr
    assert "+        with self.toggle_optimizer(d_opt):" in r.stdout  # the file after it was processed
    assert r.stderr.endswith("would rewrite 1 of 3 files (1 span); 1 could not be processed (see above)\n")


def test_cli_check_says_what_could_not_be_read(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")
    (tmp_path / "deep.py").write_text(DEEP)
    r = run("--check", "broken.py", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == ("broken.py:1:7: skipped: cannot parse: invalid syntax\n"
                        "toggleshim migrate --check: nothing checked: 1 of 1 file could not be read\n")
    (tmp_path / "gan.py").write_text(GAN)
    r = run("--check", ".", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout.startswith("./gan.py:11: ")
    assert r.stderr.endswith("toggleshim migrate --check: 1 statement toggle not exception-safe in 1 file checked; "
                             "2 could not be processed (see above)\n"), r.stderr


def test_cli_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    """`migrate --diff src | head -1`: more diff than a pipe holds, the reader gone after one line."""
    many = step("\n".join(["self.toggle_optimizer(opt)\nopt.zero_grad()\nopt.step()\nself.untoggle_optimizer(opt)"]
                          * 150))
    for n in range(3):
        (tmp_path / f"m{n}.py").write_text(many)
    command = f"{sys.executable} -m toggleshim migrate --diff . | head -1; exit ${{PIPESTATUS[0]}}"
    r = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.stdout == "--- ./m0.py\n"
    assert r.stderr == "" and r.returncode == _migrate.EXIT_CLOSED_PIPE, r.stderr


def test_cli_counts_only_what_was_written(project: Path) -> None:
    """A write that fails (here a file-size limit, EFBIG, as root too) is not counted as rewritten."""
    import resource
    import signal

    def limit() -> None:  # in the child: writes past 200 bytes fail instead of killing it (SIGXFSZ)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))

    r = subprocess.run([sys.executable, "-m", "toggleshim", "migrate", "--write", "pkg"], cwd=project,
                       capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert r.returncode == 1
    assert r.stderr == ("pkg/gan.py: skipped: cannot write: File too large (left unchanged)\n"
                        "toggleshim migrate: rewrote 0 of 2 files (0 spans); 1 could not be processed (see above)\n")
    assert (project / "pkg" / "gan.py").read_text() == GAN
    assert sorted(p.name for p in (project / "pkg").iterdir()) == [".hidden", "gan.py", "plain.py"]


def test_cli_write_keeps_owner_group_and_mode(project: Path) -> None:
    gan = project / "pkg" / "gan.py"
    if os.geteuid() == 0:  # root: a file of another user and group
        uid, gid = 12345, 23456
    else:  # another group of ours, if any (else the primary one: then the test shows the mode only)
        uid, gid = os.getuid(), next((g for g in os.getgroups() if g != os.getgid()), os.getgid())
    os.chown(gan, uid, gid)
    gan.chmod(0o604)
    r = run("--write", "pkg", cwd=project)
    assert r.returncode == 0, r.stderr
    st = gan.stat()  # first: a lost owner fails here, for that reason
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, 0o604)
    assert gan.read_text() == GAN_MIGRATED


def test_write_that_cannot_keep_the_owner_leaves_the_file(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    gan = project / "pkg" / "gan.py"
    real = os.stat

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        st = real(path, *args, **kwargs)  # type: ignore[arg-type]
        if str(path).endswith("gan.py"):  # as if the file belonged to someone else
            fields = list(st)
            fields[4] += 1
            return os.stat_result(fields)
        return st

    def chown(path: str, uid: int, gid: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "chown", chown)
    monkeypatch.chdir(project)
    assert _migrate.main(["--write", "pkg"]) == 1
    err = capsys.readouterr().err
    assert "pkg/gan.py: skipped: cannot write: the file belongs to " in err and "rewritten copy could not" in err
    assert "rewrote 0 of 2 files" in err
    assert gan.read_text() == GAN
    assert sorted(p.name for p in gan.parent.iterdir()) == [".hidden", "gan.py", "plain.py"]


NO_TORCH = '''\
import sys, traceback
attempts = []
class NoTorch:  # torch not installed: an import of it fails, and who tried is recorded
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            ours = [f for f in traceback.extract_stack() if "toggleshim" in f.filename]
            attempts.append(f"{ours[-1].filename.rsplit('/', 1)[-1]}:{ours[-1].name}" if ours else "?")
            raise ImportError("no torch here")
sys.meta_path.insert(0, NoTorch())
from toggleshim.__main__ import main
code = main(sys.argv[1:])
print("exit", code, "torch" in sys.modules, "libcst" in sys.modules, sorted(set(attempts)), file=sys.stderr)
'''


def test_cli_migrate_runs_without_torch_and_help_without_libcst(project: Path) -> None:
    """`toggleshim migrate --help` and a run on a tree in a process where torch cannot be imported:
    nothing on this path tries to import torch (`import toggleshim` included: its `torch.compile`
    marking waits for a Lightning). `--help` does not import LibCST either."""
    r = subprocess.run([sys.executable, "-c", NO_TORCH, "migrate", "--help"], cwd=project, capture_output=True,
                       text=True, timeout=120)
    assert "provably equivalent" in r.stdout
    assert r.stderr.splitlines()[-1] == "exit 0 False False []"
    r = subprocess.run([sys.executable, "-c", NO_TORCH, "migrate", "pkg"], cwd=project, capture_output=True,
                       text=True, timeout=120)
    assert "+        with self.toggle_optimizer(d_opt):" in r.stdout
    assert r.stderr.splitlines()[-1] == "exit 0 False True []"


# -- opt-in assumptions (off by default; trained in tests/test_migrate_trainer.py) ---------------

def span_of(lines: str) -> str:
    return f"self.toggle_optimizer(opt)\n{lines}\nself.untoggle_optimizer(opt)"


NO_FLAG, KEEP_ZERO_GRAD = "with self.toggle_optimizer(opt, step=False):", "zero_grad=False, step=False):"


@pytest.mark.parametrize(("assume", "body", "expected"), [
    # without the assumption nothing changes
    ((), span_of("opt.zero_grad(set_to_none=True)\nx = 1"), KEEP_ZERO_GRAD),
    (("torch2-defaults",), span_of("opt.zero_grad(set_to_none=True)\nx = 1"), NO_FLAG),
    (("torch2-defaults",), span_of("opt.zero_grad(set_to_none=False)"), KEEP_ZERO_GRAD),  # not the default
    ((), span_of("loss = self(x)\nopt.zero_grad()"), KEEP_ZERO_GRAD),
    (("forward-reads-no-grad",), span_of("loss = self(x)\nopt.zero_grad()"), NO_FLAG),
    # a line that visibly touches gradients keeps zero_grad in place even so
    *[(("forward-reads-no-grad",), span_of(f"{line}\nopt.zero_grad()"), KEEP_ZERO_GRAD)
      for line in ("self.manual_backward(loss)", "loss.backward()", "g = self.w.grad", "other.step()",
                   "if c:\n    opt.zero_grad()", "self.clip_gradients(opt, 1.0)", "torch.autograd.grad(y, x)")],
    # both: the loss before zero_grad(set_to_none=True)
    (("torch2-defaults", "forward-reads-no-grad"), span_of("loss = self(x)\nopt.zero_grad(set_to_none=True)"), NO_FLAG),
])
def test_migrate_assumptions(assume: tuple[str, ...], body: str, expected: str) -> None:
    new = migrate_source(step(body).encode(), assume=frozenset(assume)).new.decode()
    assert expected in new


def test_migrate_unknown_assumption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="unknown assumption"):
        migrate_source(b"x = 1\n", assume=frozenset({"bogus"}))
    (tmp_path / "m.py").write_text(step("self.toggle_optimizer(opt)\nloss = self(x)\nopt.zero_grad()\n"
                                        "self.untoggle_optimizer(opt)"))
    proc = run_here("--assume", "bogus", "m.py", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert proc.returncode == 2 and "invalid choice: 'bogus'" in proc.stderr
    proc = run_here("--assume", "forward-reads-no-grad", "m.py", cwd=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert proc.returncode == 0 and "+    with self.toggle_optimizer(opt, step=False):" in proc.stdout
