"""``toggleshim migrate``: the rewrite on source text, the refusals and their reasons, and the
command as users run it (fresh subprocesses, piped and on a terminal) with bad input.

Training equivalence of every rule is in ``tests/test_migrate_trainer.py`` (real ``Trainer.fit``) and
``property_tests/test_migrate_property.py`` (Hypothesis).
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toggleshim import _migrate
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


def test_migrate_class_with_its_own_toggle_optimizer_left_alone() -> None:
    src = "class M:\n    def toggle_optimizer(self, o):\n        pass\n\n" + textwrap.indent(
        step("self.toggle_optimizer(opt)\nself.untoggle_optimizer(opt)"), "    ")
    new, reasons = migrate(src)
    assert new == src and "defines its own toggle_optimizer" in reasons[0]


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
    assert r.stderr == 'toggleshim migrate: toggleshim migrate needs LibCST: pip install "toggleshim[migrate]"\n'


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
    real = _migrate._read

    def read(path: str) -> bytes:
        if path.endswith("plain.py"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(_migrate, "_read", read)
    monkeypatch.chdir(project)
    assert _migrate.main(["--write", "pkg"]) == 1
    err = capsys.readouterr().err
    assert "pkg/plain.py: skipped: cannot read: Permission denied" in err and "1 could not be processed" in err
    assert (project / "pkg" / "gan.py").read_text() == GAN_MIGRATED


@pytest.mark.parametrize("fail_at", ["write", "replace"])
def test_write_failing_midway_leaves_the_file_whole(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], fail_at: str) -> None:
    gan = project / "pkg" / "gan.py"
    if fail_at == "replace":
        def replace(src: str, dst: str) -> None:
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(_migrate.os, "replace", replace)
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

        monkeypatch.setattr(_migrate.os, "fdopen", lambda fd, mode: HalfFile(real_fdopen(fd, mode)))
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
