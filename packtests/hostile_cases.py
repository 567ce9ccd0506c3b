"""Hostile and malformed input: each case, what it feeds fixpack, and the refusal expected.

Shared by tests/integration/test_hostile_input.py (one test per case) and bench/reliability_report.py.
A case edits a copy of a locked synthetic pack (and sometimes the tree), then runs one
command in its own process:

  validate   `fixpack validate` (what CI runs on every change of the pack)
  apply      `fixpack apply` with the lock re-pinned to the edited fix's own hash, so the
             engine really runs the hostile fix and must refuse what it does or produces
  lock       lock generation (record mode, idempotence checked), as `fixpack lock` does
  raw        the given command line as is

Every case checks the exit code, a message that names the problem, no traceback, and that
neither the tree nor a folder outside it changed (nor a marker file appeared).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packtests import builders as B
from packtests import reliability_lib as L


@dataclass
class Ctx:
    root: Path  # the pack
    tree: Path
    outside: Path  # a folder outside the tree: nothing may ever be written there
    marker: Path  # a file a hostile input tries to create

    def fix(self, fid: str) -> Path:
        return self.root / "fixes" / fid

    def diff(self, text: str | bytes, fid: str = "fix-one") -> None:
        p = self.fix(fid) / "patch.diff"
        p.write_bytes(text if isinstance(text, bytes) else text.encode())

    def codemod(
        self, body: str, fid: str = "fix-two", target: str = "pkg_a/sub/other.py", nodes: str = '["Batch.rows"]'
    ) -> None:
        """A codemod whose handler, on the function named last in ``nodes``, runs ``body``
        (``node`` is that function; what the body returns replaces it)."""
        name = json.loads(nodes)[0].rsplit(".", 1)[-1]
        code = (
            "import os, sys, subprocess\n"
            "import libcst.matchers as m\n"
            "from fixpack.kinds.codemod import Codemod\n\n"
            "class Evil(Codemod):\n"
            "    DESCRIPTION = 'hostile'\n"
            f"    TARGET = {target!r}\n"
            "    PLACES = ('the function',)\n\n"
            f"    @m.leave(m.FunctionDef(name=m.Name({name!r})))\n"
            "    def evil(self, original, updated):\n"
            "        return self.at('the function', updated, self.rewrite(updated))\n\n"
            "    def rewrite(self, node):\n" + "".join(f"        {line}\n" for line in body.strip("\n").splitlines())
        )
        (self.fix(fid) / "codemod.py").write_text(code)

    def yaml(self, text: str, fid: str = "fix-one") -> None:
        (self.fix(fid) / "fix.yaml").write_text(text)

    def profile(self, entries: list, packages=("pkg_a", "pkg_b")) -> None:
        import yaml

        data = {"name": "test", "base": {"sources": {}}, "packages": list(packages), "fixes": entries}
        (self.root / "profiles" / "test.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    def requires(self, fid: str, req: list[str]) -> None:
        p = self.fix(fid) / "fix.yaml"
        p.write_text(p.read_text() + f"requires: {json.dumps(req)}\n")


@dataclass
class Case:
    id: str
    what: str
    setup: Callable[[Ctx], None]
    mode: str  # validate | apply | lock | raw
    rc: int
    msg: str  # regex searched in stdout + stderr
    template: str = "basic"  # basic: fix-one (diff) first; codemod-first: fix-two (codemod) first
    forge: str | None = None  # re-pin this fix's hash in the lock
    args: tuple = ()  # extra arguments (apply) or the command line (raw)
    tree_changes: bool = False  # the setup itself edits the tree (the digest is taken after it)
    env: dict | None = None  # more environment for the command (FIXPACK_SANDBOX=hook, say)


GOOD_HUNK = B.DIFF_ONE[B.DIFF_ONE.index("@@") :]  # fix-one's hunk, under other headers


def hdr(a: str, b: str | None = None) -> str:
    return f"--- {a}\n+++ {b or a.replace('a/', 'b/', 1)}\n"


def _d(text):
    return lambda c: c.diff(text)


def _cm(body, **kw):
    return lambda c: c.codemod(body, **kw)


def _y(mutate):
    """Edit fix-one's fix.yaml with ``mutate(text) -> text``."""

    def setup(c: Ctx):
        p = c.fix("fix-one") / "fix.yaml"
        p.write_text(mutate(p.read_text()))

    return setup


def _tree(fn):
    return fn


def _symlink_out_dir(c: Ctx):
    """pkg_a/evil -> a folder outside the package, and fix-one aimed through it."""
    (c.outside / "mod.py").write_text(B.MOD_A)
    (c.tree / "pkg_a" / "evil").symlink_to(c.outside)
    c.yaml(B.fix_yaml("fix-one", "diff", ["pkg_a/evil/mod.py"]))
    c.diff(B.DIFF_ONE.replace("pkg_a/mod.py", "pkg_a/evil/mod.py"))


def _target_symlink_out(c: Ctx):
    (c.outside / "mod.py").write_text(B.MOD_A)
    t = c.tree / "pkg_a" / "mod.py"
    t.unlink()
    t.symlink_to(c.outside / "mod.py")


def _target_crlf(c: Ctx):
    t = c.tree / "pkg_a" / "mod.py"
    t.write_bytes(t.read_bytes().replace(b"\n", b"\r\n"))


def _ambiguous(c: Ctx):
    # a hunk named at line 3 whose old text occurs twice elsewhere (the file made so in the tree
    # would be a base mismatch; here the *pack* is wrong: the hunk names the wrong line)
    c.diff(
        hdr("a/pkg_a/mod.py")
        + "@@ -3,1 +3,1 @@\n-line_12 = 12\n+line_12 = 12  # fixed\n".replace("-line_12 = 12\n", "-line_12 = 12\n")
    )


def _port_dup(c: Ctx):
    d = c.root / "ports" / "evil" / "fixes" / "fix-one"
    shutil.copytree(c.fix("fix-one"), d)
    (c.root / "ports" / "evil" / "port.yaml").write_text(
        "name: evil\nprofile: test\npatches: [fix-one]\nplugin: {name: x}\n"
    )


def _lock_text(text: str):
    def setup(c: Ctx):
        (c.root / "profiles" / "test.lock.json").write_text(text)

    return setup


def _lock_edit(fn):
    def setup(c: Ctx):
        p = c.root / "profiles" / "test.lock.json"
        data = json.loads(p.read_text())
        fn(data)
        p.write_text(json.dumps(data))

    return setup


PWN = "{marker}"  # replaced by the marker path at run time

# Issue 41: a fix's process hands the driver something other than a regular file where its
# output should be, or shapes its stage to exhaust the driver. The FIFO lives in the work folder
# beside ``outside`` (a FIFO there would hang the test's own digest of ``outside``).
SPECIALS = "os.path.join(os.path.dirname(os.path.dirname({marker!r})), 'specials')"
FORGE_RESULT = "import json\nprint(json.dumps(dict(outputs={'pkg_a/sub/other.py': '0.out'})), flush=True)\nos._exit(0)"


def _specials(c: Ctx) -> None:
    (c.outside.parent / "specials").mkdir(exist_ok=True)
    os.mkfifo(c.outside.parent / "specials" / "fifo")


def _output_is(body: str):
    """A codemod that makes ``0.out`` something else (``body``), then forges the worker's answer
    so the driver goes to read it."""
    return lambda c: (_specials(c), c.codemod(f"{body}\n{FORGE_RESULT}"))


# a chain of folders in the current folder, by libc (a path that long is more than os.makedirs
# takes, and the audit hook is not what is tested here), ending where it began
DEEP_CHAIN = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
here = os.getcwd()
for _ in range({depth}):
    if libc.mkdir(b'{name}', 0o700) != 0:
        raise OSError(ctypes.get_errno(), 'mkdir')
    os.chdir('{name}')
os.chdir(here)
"""


def _deep_chain_in_package(c: Ctx) -> None:
    B.deep_chain(c.tree / "pkg_a", 100, name="deep")


CASES: list[Case] = [
    # ---- diff headers and paths
    Case(
        "diff-dotdot-header",
        "diff header with '..' leaving the package",
        _d(hdr("a/pkg_a/../pkg_b/x.py") + GOOD_HUNK),
        "apply",
        4,
        r"contains '\.\.'",
        forge="fix-one",
    ),
    Case(
        "diff-absolute-header",
        "diff header with an absolute path",
        _d("--- /etc/passwd\n+++ /etc/passwd\n" + GOOD_HUNK),
        "apply",
        4,
        "absolute",
        forge="fix-one",
    ),
    Case(
        "diff-double-slash-header",
        "diff header a//tmp/x (absolute after the prefix)",
        _d(hdr("a//tmp/x.py", "b//tmp/x.py") + GOOD_HUNK),
        "apply",
        4,
        "absolute",
        forge="fix-one",
    ),
    Case(
        "diff-backslash-header",
        "diff header with backslashes",
        _d(hdr("a/pkg_a\\..\\mod.py", "b/pkg_a\\..\\mod.py") + GOOD_HUNK),
        "apply",
        4,
        "backslash",
        forge="fix-one",
    ),
    Case(
        "diff-tilde-header",
        "diff header starting with ~",
        _d(hdr("~/x.py", "~/x.py") + GOOD_HUNK),
        "apply",
        4,
        "absolute",
        forge="fix-one",
    ),
    Case(
        "diff-nul-bytes",
        "NUL bytes in the diff",
        _d(B.DIFF_ONE.encode().replace(b"line_12 = 12  #", b"line_12 = 12\x00 #")),
        "apply",
        4,
        "NUL",
        forge="fix-one",
    ),
    Case(
        "diff-rename",
        "a diff that renames a file",
        _d(hdr("a/pkg_a/mod.py", "b/pkg_a/other.py") + GOOD_HUNK),
        "apply",
        4,
        "renames are not supported",
        forge="fix-one",
    ),
    Case(
        "diff-creates-file",
        "a diff that creates a file",
        _d("--- /dev/null\n+++ b/pkg_a/new.py\n@@ -0,0 +1 @@\n+x = 1\n"),
        "apply",
        4,
        "creates a file",
        forge="fix-one",
    ),
    Case(
        "diff-deletes-file",
        "a diff that deletes a file",
        _d("--- a/pkg_a/mod.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-line_1 = 1\n-line_2 = 2\n"),
        "apply",
        4,
        "deletes a file",
        forge="fix-one",
    ),
    Case(
        "diff-git-binary",
        "a git binary patch",
        _d("diff --git a/pkg_a/mod.py b/pkg_a/mod.py\nGIT binary patch\nliteral 3\nKcmZ?wbN>Ja0RR91\n"),
        "apply",
        4,
        "binary",
        forge="fix-one",
    ),
    Case(
        "diff-binary-files-differ",
        "'Binary files ... differ'",
        _d("Binary files a/pkg_a/mod.py and b/pkg_a/mod.py differ\n"),
        "apply",
        4,
        "binary",
        forge="fix-one",
    ),
    Case("diff-empty", "an empty diff", _d(""), "apply", 4, "empty", forge="fix-one"),
    Case("diff-whitespace-only", "a diff of blank lines", _d("\n\n  \n"), "apply", 4, "empty", forge="fix-one"),
    Case(
        "diff-truncated",
        "a diff cut off in the middle of a hunk",
        _d(B.DIFF_ONE[: B.DIFF_ONE.index("line_13")]),
        "apply",
        4,
        "truncated|malformed|do not match",
        forge="fix-one",
    ),
    Case(
        "diff-headers-only",
        "file headers and no hunk",
        _d(hdr("a/pkg_a/mod.py")),
        "apply",
        4,
        "no hunks|no file sections|malformed",
        forge="fix-one",
    ),
    Case(
        "diff-not-a-diff",
        "prose instead of a diff",
        _d("This is not a patch.\nJust text.\n"),
        "apply",
        4,
        "no file sections",
        forge="fix-one",
    ),
    Case(
        "diff-not-utf8",
        "a diff that is not UTF-8",
        _d(B.DIFF_ONE.encode().replace(b"# fixed", b"# \xff\xfe fixed")),
        "apply",
        4,
        "not UTF-8",
        forge="fix-one",
    ),
    Case(
        "diff-undeclared-file",
        "a diff changing a file fix.yaml does not declare",
        _d(B.DIFF_ONE + B.DIFF_OPT),
        "apply",
        4,
        "does not declare",
        forge="fix-one",
    ),
    Case(
        "diff-same-file-twice",
        "the same file twice in one diff",
        _d(B.DIFF_ONE + B.DIFF_ONE),
        "apply",
        4,
        "appears twice",
        forge="fix-one",
    ),
    Case(
        "diff-declared-not-changed",
        "fix.yaml declares a file the diff leaves alone",
        lambda c: c.yaml(B.fix_yaml("fix-one", "diff", ["pkg_a/mod.py", "pkg_b/x.py"])),
        "apply",
        2,
        "pins",
        forge="fix-one",
    ),
    Case(
        "diff-hunk-wrong-line-ambiguous",
        "a hunk naming the wrong line whose text occurs at two places",
        lambda c: c.diff(
            hdr("a/pkg_a/mod.py") + "@@ -1,2 +1,2 @@\n-line_5 = 5\n-line_6 = 6\n+line_5 = 5  # fixed\n+line_6 = 6\n"
        ),
        "apply",
        4,
        "does not match",
        forge="fix-one",
    ),
    Case(
        "diff-hunk-past-eof",
        "a hunk beyond the end of the file",
        _d(hdr("a/pkg_a/mod.py") + GOOD_HUNK.replace("@@ -9,7 +9,7 @@", "@@ -90,7 +90,7 @@")),
        "apply",
        4,
        "does not match",
        forge="fix-one",
    ),
    Case(
        "diff-overlapping-hunks",
        "hunks that overlap",
        _d(
            B.DIFF_ONE
            + GOOD_HUNK.replace("@@ -9,7 +9,7 @@", "@@ -10,7 +10,7 @@")
            .replace(" line_9 = 9\n", "")
            .replace(" line_15 = 15\n", " line_15 = 15\n line_16 = 16\n")
        ),
        "apply",
        4,
        "overlaps|does not match|twice",
        forge="fix-one",
    ),
    Case(
        "diff-crlf-patch-lf-file",
        "a CRLF patch against an LF file",
        _d(B.DIFF_ONE.replace("\n", "\r\n")),
        "apply",
        4,
        "does not match",
        forge="fix-one",
    ),
    Case(
        "diff-lf-patch-crlf-file",
        "the target converted to CRLF (an LF patch would not apply)",
        _target_crlf,
        "apply",
        3,
        "expected the pristine",
        tree_changes=True,
    ),
    Case(
        "diff-does-not-compile",
        "a diff whose result is not valid Python",
        _d(B.DIFF_ONE.replace("+line_12 = 12  # fixed", "+line_12 = = 12")),
        "apply",
        4,
        "does not compile",
        forge="fix-one",
    ),
    Case(
        "diff-wrong-result",
        "a diff giving other bytes than its pin",
        _d(B.DIFF_ONE.replace("# fixed", "# tampered")),
        "apply",
        4,
        "the pin is",
        forge="fix-one",
    ),
    # ---- paths in the tree
    Case(
        "path-through-symlink-out",
        "a target path through a symlinked folder leading out of the package",
        _symlink_out_dir,
        "apply",
        6,
        "outside the package folder",
        tree_changes=True,
        forge="fix-one",
    ),
    Case(
        "target-symlink-out",
        "the target file is a symlink out of the package",
        _target_symlink_out,
        "apply",
        6,
        "outside the package folder",
        tree_changes=True,
    ),
    Case(
        "target-symlink-in",
        "the target file is a symlink inside the package",
        lambda c: (
            (c.tree / "pkg_a" / "real.py").write_bytes((c.tree / "pkg_a" / "mod.py").read_bytes()),
            (c.tree / "pkg_a" / "mod.py").unlink(),
            (c.tree / "pkg_a" / "mod.py").symlink_to("real.py"),
        ),
        "apply",
        6,
        "found a symlink",
        tree_changes=True,
    ),
    Case(
        "target-is-folder",
        "the target is a folder",
        lambda c: ((c.tree / "pkg_a" / "mod.py").unlink(), (c.tree / "pkg_a" / "mod.py").mkdir()),
        "apply",
        6,
        "found a folder",
        tree_changes=True,
    ),
    Case(
        "target-missing",
        "the target file does not exist",
        lambda c: (c.tree / "pkg_a" / "mod.py").unlink(),
        "apply",
        3,
        "expected the pristine",
        tree_changes=True,
    ),
    # ---- fix.yaml
    Case(
        "yaml-python-object-apply",
        "fix.yaml with !!python/object/apply:os.system",
        _y(
            lambda t: t.replace(
                "summary: synthetic fix fix-one", "summary: !!python/object/apply:os.system ['touch {marker}']"
            )
        ),
        "validate",
        2,
        "invalid YAML|could not determine a constructor",
    ),
    Case(
        "yaml-python-name",
        "fix.yaml with !!python/name:os.system",
        _y(lambda t: t + "notes: !!python/name:os.system\n"),
        "validate",
        2,
        "invalid YAML",
    ),
    Case(
        "yaml-python-object-new",
        "fix.yaml with !!python/object/new:subprocess.Popen",
        _y(lambda t: t + "notes: !!python/object/new:subprocess.Popen [['touch', '{marker}']]\n"),
        "apply",
        2,
        "invalid YAML",
    ),
    Case(
        "yaml-not-a-mapping", "fix.yaml is a list", _y(lambda t: "- id: fix-one\n"), "validate", 2, "expected a mapping"
    ),
    Case(
        "yaml-unknown-key",
        "fix.yaml with an unknown key",
        _y(lambda t: t + "run_before: rm -rf /\n"),
        "validate",
        2,
        "unknown key 'run_before'",
    ),
    Case(
        "yaml-wrong-type",
        "targets is a string",
        _y(
            lambda t: (
                t.split("targets:")[0] + "targets: pkg_a/mod.py\nupstream: null\nremove_when: x\ntests: [test_it.py]\n"
            )
        ),
        "validate",
        2,
        "key 'targets' must be list",
    ),
    Case(
        "yaml-syntax-error",
        "fix.yaml that is not YAML",
        _y(lambda t: t + "notes: [unclosed\n"),
        "validate",
        2,
        "invalid YAML",
    ),
    Case(
        "yaml-alias-bomb",
        "nested aliases (billion laughs) in fix.yaml",
        _y(
            lambda t: (
                t
                + "evidence: &a0 [x, x, x, x, x, x, x, x, x]\n"
                + "".join(f"change: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 2))
                + "notes: &a9 ["
                + ", ".join(["*a1"] * 9)
                + "]\n"
            )
        ),
        "validate",
        2,
        "key 'evidence' must be str",
    ),
    Case(
        "yaml-duplicate-id",
        "fix.yaml whose id is another fix's (duplicate fix ids)",
        _y(lambda t: t.replace("id: fix-one", "id: fix-two")),
        "validate",
        2,
        "but the folder is 'fix-one'",
    ),
    Case(
        "yaml-id-not-slug",
        "an id that looks like an option",
        lambda c: c.profile([{"id": "--all"}]),
        "validate",
        2,
        "not a valid id",
    ),
    Case(
        "yaml-target-dotdot",
        "a target path with '..'",
        _y(lambda t: t.replace("path: mod.py", "path: ../pkg_b/x.py")),
        "validate",
        2,
        r"contains '\.\.'",
    ),
    Case(
        "yaml-target-absolute",
        "an absolute target path",
        _y(lambda t: t.replace("path: mod.py", "path: /etc/passwd")),
        "validate",
        2,
        "absolute",
    ),
    Case(
        "yaml-target-nul",
        "a target path with a NUL",
        _y(lambda t: t.replace("path: mod.py", 'path: "mod.py\\0.txt"')),
        "validate",
        2,
        "NUL",
    ),
    Case(
        "yaml-target-package-escape",
        "a target package named '..'",
        _y(lambda t: t.replace("package: pkg_a", "package: '..'")),
        "validate",
        2,
        "not a valid id",
    ),
    Case(
        "yaml-target-foreign-package",
        "a target in a package the profile does not name",
        _y(lambda t: t.replace("package: pkg_a", "package: os")),
        "validate",
        2,
        "not one of the profile's packages",
    ),
    Case(
        "yaml-target-twice",
        "the same target listed twice",
        lambda c: c.yaml(B.fix_yaml("fix-one", "diff", ["pkg_a/mod.py", "pkg_a/mod.py"])),
        "validate",
        2,
        "listed twice",
    ),
    Case(
        "yaml-two-changes",
        "both patch.diff and codemod.py in one fix",
        lambda c: (c.fix("fix-one") / "codemod.py").write_text("x = 1\n"),
        "validate",
        2,
        "keep one change per fix",
    ),
    Case(
        "yaml-no-tests",
        "a fix without a regression test",
        _y(lambda t: t.replace("tests: [test_it.py]", "tests: []")),
        "validate",
        2,
        "every fix needs a regression test",
    ),
    # ---- profiles and requirements
    Case(
        "profile-fix-twice",
        "a profile naming a fix twice",
        lambda c: c.profile([{"id": "fix-one"}, {"id": "fix-two"}, {"id": "fix-one"}]),
        "validate",
        2,
        "listed twice",
    ),
    Case(
        "profile-unknown-fix",
        "a profile naming a fix that does not exist",
        lambda c: c.profile([{"id": "fix-one"}, {"id": "no-such-fix"}]),
        "validate",
        2,
        "has no folder",
    ),
    Case(
        "profile-python-tag",
        "a profile with a python tag",
        lambda c: (c.root / "profiles" / "test.yaml").write_text(
            "name: !!python/object/apply:os.system ['touch {marker}']\n"
        ),
        "validate",
        2,
        "invalid YAML",
    ),
    Case(
        "requires-cycle",
        "two fixes requiring each other",
        lambda c: (c.requires("fix-one", ["fix-two"]), c.requires("fix-two", ["fix-one"])),
        "validate",
        2,
        "cycle",
    ),
    Case(
        "requires-self", "a fix requiring itself", lambda c: c.requires("fix-one", ["fix-one"]), "validate", 2, "cycle"
    ),
    Case(
        "requires-absent",
        "a fix requiring one outside the selection",
        lambda c: c.requires("fix-two", ["fix-opt"]),
        "validate",
        2,
        "not part of this selection|comes after",
    ),
    Case(
        "port-duplicate-id",
        "a port patch with a profile fix's id (duplicate fix ids)",
        _port_dup,
        "raw",
        2,
        "appear both in the port and in the profile",
        args=("apply", "--port", "evil"),
    ),
    # ---- command line
    Case(
        "optin-looks-like-option",
        "an opt-in name that looks like an option",
        lambda c: None,
        "raw",
        2,
        "did you mean an option",
        args=("apply", "--", "--all"),
    ),
    Case(
        "optin-dash-rf",
        "apply_all.py given -rf as an opt-in",
        lambda c: None,
        "raw",
        2,
        "unrecognized arguments|did you mean",
        args=("apply_all", "-rf"),
    ),
    Case(
        "optin-path",
        "an opt-in name that is a path",
        lambda c: None,
        "raw",
        2,
        "unknown opt-in",
        args=("apply", "../../etc/passwd"),
    ),
    Case(
        "optin-default-fix",
        "naming a default fix as an opt-in",
        lambda c: None,
        "raw",
        2,
        "unknown opt-in fix 'fix-one'",
        args=("apply", "fix-one"),
    ),
    # ---- lock
    Case("lock-not-json", "a lock that is not JSON", _lock_text("{pins: ["), "apply", 2, "not valid JSON"),
    Case(
        "lock-wrong-format",
        "a lock of an unknown format",
        _lock_text('{"format": 99}'),
        "apply",
        2,
        "unknown lock format",
    ),
    Case(
        "lock-fix-changed",
        "a fix edited after the lock (hash differs)",
        _d(B.DIFF_ONE.replace("# fixed", "# other")),
        "apply",
        2,
        "changed since",
    ),
    # ---- codemods
    Case(
        "codemod-raises",
        "a codemod that raises",
        _cm("raise RuntimeError('boom from codemod')"),
        "apply",
        4,
        "boom from codemod",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-loops-forever",
        "a codemod that never returns (timeout)",
        _cm("while True:\n    pass"),
        "apply",
        4,
        "did not finish within",
        template="codemod-first",
        forge="fix-two",
        args=("--timeout", "4"),
    ),
    Case(
        "codemod-writes-outside",
        "a codemod writing a file outside its staging area",
        _cm("open({marker!r}, 'w').write('pwned')\nreturn node"),
        "apply",
        4,
        "outside its staging area",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-writes-target",
        "a codemod writing its target in the tree directly",
        _cm("open(os.environ['FIXPACK_TEST_TREE'] + '/pkg_a/sub/other.py', 'a').write('# pwned')\nreturn node"),
        "apply",
        4,
        "outside its staging area",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-renames-out",
        "a codemod moving a staged file out (os.rename)",
        _cm("open('x', 'w').write('pwned')\nos.rename('x', {marker!r})\nreturn node"),
        "apply",
        4,
        "outside its staging area",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-symlinks-out",
        "a codemod planting a symlink outside",
        _cm("os.symlink(os.getcwd(), {marker!r})\nreturn node"),
        "apply",
        4,
        "outside its staging area",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-os-system",
        "a codemod running a shell command",
        _cm("os.system('touch {marker}')\nreturn node"),
        "apply",
        4,
        "start a process",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-subprocess",
        "a codemod starting a process",
        _cm("subprocess.run(['touch', {marker!r}])\nreturn node"),
        "apply",
        4,
        "start a process",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-kills-driver",
        "a codemod killing the fixpack process",
        _cm("import signal\nos.kill(os.getppid(), signal.SIGKILL)\nreturn node"),
        "apply",
        4,
        "start a process|send a signal|os.kill",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-deletes-pack-file",
        "a codemod deleting a file of the pack",
        _cm("os.remove(__file__)\nreturn node"),
        "apply",
        4,
        "outside its staging area",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-invalid-python",
        "a codemod whose result does not compile",
        _cm("import libcst as cst\nreturn cst.parse_statement('def rows(self, ids):\\n    break\\n')"),
        "apply",
        4,
        "does not compile",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-returns-non-node",
        "a codemod returning a string",
        _cm("return 'def rows(self): pass'"),
        "apply",
        4,
        "not a libcst node",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-not-idempotent",
        "a codemod that changes its own output again",
        _cm(
            "import libcst as cst\nreturn cst.parse_statement(cst.Module([]).code_for_node(node).replace('return [', 'return [] + ['))"
        ),
        "lock",
        4,
        "not idempotent",
        template="codemod-first",
    ),
    Case(
        "codemod-undeclared-target",
        "a codemod aimed at a file fix.yaml does not declare",
        _cm("return node", target="pkg_a/mod.py"),
        "apply",
        4,
        "does not declare",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-missing-node",
        "a codemod naming a definition that does not exist",
        _cm("return node", nodes='["Batch.nope"]'),
        "apply",
        4,
        "found 0",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-syntax-error",
        "a codemod.py that does not parse",
        lambda c: (c.fix("fix-two") / "codemod.py").write_text("def broken(:\n"),
        "validate",
        2,
        "does not parse",
        template="codemod-first",
    ),
    Case(
        "codemod-no-rewrite",
        "a codemod.py defining no Codemod",
        lambda c: (c.fix("fix-two") / "codemod.py").write_text("X = 1\n"),
        "apply",
        4,
        "defines no Codemod subclass",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-forges-result",
        "a codemod that writes garbage output and fakes the worker's answer",
        _cm(
            "import json\nopen('0.out', 'w').write('garbage = 1\\n')\nprint(json.dumps(dict(outputs={'pkg_a/sub/other.py': '0.out'})), flush=True)\nos._exit(0)"
        ),
        "apply",
        4,
        "the pin is",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-disables-compile-check",
        "a codemod that replaces compile() and returns broken code",
        _cm(
            "import builtins, libcst as cst\nbuiltins.compile = lambda *a, **k: None\nreturn cst.parse_statement('def rows(self, ids):\\n    break\\n')"
        ),
        "apply",
        4,
        "the pin is",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-exits-silently",
        "a codemod that exits its process",
        _cm("os._exit(3)"),
        "apply",
        4,
        "crashed with no output|nothing was written",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-extra-staged-file",
        "a codemod writing an undeclared file next to its output",
        _cm("open('extra.py', 'w').write('x')\nreturn node"),
        "apply",
        4,
        "did not declare",
        template="codemod-first",
        forge="fix-two",
    ),
    # ---- issue 41: what the driver reads of a fix's stage, and what it removes
    Case(
        "output-symlink-to-fifo",
        "a codemod replacing its output by a symlink to a FIFO (a read by path would wait for ever)",
        _output_is(
            f"os.remove('0.out') if os.path.lexists('0.out') else None\nos.symlink(os.path.join({SPECIALS}, 'fifo'), '0.out')"
        ),
        "apply",
        4,
        r"its output for pkg_a/sub/other\.py, \S*0\.out: a symlink, not a regular file",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "output-symlink-to-dev-zero",
        "a codemod replacing its output by a symlink to /dev/zero (a read by path would never end)",
        _output_is("os.symlink('/dev/zero', '0.out')"),
        "apply",
        4,
        r"its output for pkg_a/sub/other\.py, \S*0\.out: a symlink, not a regular file",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "output-is-folder",
        "a codemod making its output a folder",
        _output_is("os.mkdir('0.out')\nopen('0.out/x', 'w').write('x')"),
        "apply",
        4,
        r"its output for pkg_a/sub/other\.py, \S*0\.out: a folder, not a regular file",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "output-is-fifo",
        "a codemod making a FIFO of its output itself",
        _output_is("os.mkfifo('0.out')"),
        "apply",
        4,
        "Operation not permitted|refused by the kernel",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "output-missing",
        "a codemod that removes its output and says it wrote it",
        _output_is("None"),
        "apply",
        4,
        r"did not write \S*0\.out",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "stage-3000-deep",
        "a codemod leaving a 3,000-deep chain of folders in its stage (a recursive removal crashes and leaves it)",
        _cm(DEEP_CHAIN.format(depth=3000, name="a") + "return node"),
        "apply",
        4,
        r"wrote files it did not declare \(a\)",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "stage-wide",
        "a codemod leaving 20,000 files in its stage",
        _cm("for i in range(20000):\n    open(f'f{i}', 'w').close()\nreturn node"),
        "apply",
        4,
        r"wrote files it did not declare \(f\d+(, f\d+){9} and 19990 more\)",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "stage-symlinks-out",
        "a codemod leaving symlinks to outside folders and a symlink loop in its stage",
        _cm(
            "os.symlink(os.path.dirname({marker!r}), 'out')\nos.mkdir('d')\n"
            "os.symlink(os.path.dirname(os.path.dirname({marker!r})), 'd/up')\nos.symlink('l1', 'l0')\nos.symlink('l0', 'l1')\nreturn node"
        ),
        "apply",
        4,
        r"wrote files it did not declare \(d, l0, l1, out\)",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "deep-folder-in-package",
        "a 100-deep chain of folders planted in a package folder before the run",
        _deep_chain_in_package,
        "apply",
        6,
        r"pkg_a/deep/(deep/)+deep: folders nested deeper than 64 levels below \S*pkg_a",
        tree_changes=True,
    ),
    Case(
        "error-with-terminal-escapes",
        "a codemod whose error clears the screen, forges an 'already applied' line and sets the clipboard",
        _cm(
            "raise RuntimeError('\\x1b[2J\\x1b[H\\nfix-two.................................applied\\x1b]52;c;cHduZWQ=\\x07')"
        ),
        "apply",
        4,
        r"RuntimeError: \\x1b\[2J\\x1b\[H\n  \| fix-two\.+applied\\x1b\]52;c;cHduZWQ=\\x07",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "output-with-terminal-escapes",
        "a codemod printing terminal escapes to its output before it fails",
        _cm(
            "import sys\nsys.stderr.write('\\x1b[2J\\rfix-one....applied\\n\\x9b31m')\nsys.stderr.flush()\nraise RuntimeError('boom')"
        ),
        "apply",
        4,
        r"--- its output:\n(  \| .*\n)*  \| \\x1b\[2J\\x0dfix-one\.+applied",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "undeclared-name-with-escapes",
        "a codemod naming an undeclared file with terminal escapes",
        _cm("open('\\x1b[2Jevil\\x07', 'w').close()\nreturn node"),
        "apply",
        4,
        r"did not declare \(\\x1b\[2Jevil\\x07\)",
        template="codemod-first",
        forge="fix-two",
    ),
    Case(
        "codemod-import-error",
        "a codemod importing a module that does not exist",
        lambda c: (c.fix("fix-two") / "codemod.py").write_text("import no_such_module_xyz\n"),
        "apply",
        4,
        "No module named 'no_such_module_xyz'",
        template="codemod-first",
        forge="fix-two",
    ),
]


def run_case(case: Case, work: Path) -> subprocess.CompletedProcess:
    """Run one case; raises AssertionError when fixpack does not refuse it as expected."""
    work.mkdir(parents=True, exist_ok=True)
    root, tree = L.copy_pack(case.template, work)
    outside = work / "outside"
    outside.mkdir()
    marker = outside / "pwned"
    ctx = Ctx(root, tree, outside, marker)
    setup = case.setup
    setup(ctx)
    # the marker path is put into the hostile text at run time
    for p in list((root / "fixes").rglob("*")) + list((root / "profiles").glob("*.yaml")):
        if p.is_file() and p.suffix in (".py", ".yaml", ".diff"):
            raw = p.read_bytes()
            if b"{marker}" in raw or b"{marker!r}" in raw:
                p.write_bytes(
                    raw.replace(b"{marker!r}", repr(str(marker)).encode()).replace(b"{marker}", str(marker).encode())
                )
    if case.forge:
        B.forge_lock(root, case.forge)
    before = B.tree_digest(tree)
    outside_before = B.tree_digest(outside)
    pack_before = B.tree_digest(root)
    env = {"FIXPACK_TEST_TREE": str(tree), **(case.env or {})}
    if case.mode == "validate":
        r = B.fixpack("validate", pack=root, env=env)
    elif case.mode == "apply":
        r = B.fixpack("apply", "--profile", "test", "--root", str(tree), *case.args, pack=root, env=env)
    elif case.mode == "lock":
        code = (
            "import sys\nfrom pathlib import Path\n"
            "from packtests.builders import write_lock\nfrom fixpack.errors import FixpackError\n"
            "try:\n"
            f"    write_lock(Path({str(root)!r}))\n"
            "except FixpackError as exc:\n"
            "    print(f'fixpack: {exc.label}: {exc}', file=sys.stderr)\n"
            "    sys.exit(exc.exit_code)\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(__import__("os").environ, PYTHONPATH=str(B.REPO)),
        )
    elif case.mode == "raw":
        if case.args[0] == "apply_all":
            r = B.apply_all("--profile", "test", "--root", str(tree), "--pack", str(root), *case.args[1:], env=env)
        else:
            r = B.fixpack(
                *case.args[:1], "--profile", "test", "--root", str(tree), "--pack", str(root), *case.args[1:], env=env
            )
    else:
        raise ValueError(case.mode)
    out = r.stdout + r.stderr
    assert r.returncode == case.rc, f"{case.id}: exit {r.returncode}, expected {case.rc}:\n{out[-2000:]}"
    assert re.search(case.msg, out, re.I | re.S), f"{case.id}: no {case.msg!r} in:\n{out[-2000:]}"
    assert "Traceback" not in out or case.mode == "apply" and "--- its output" in out, (
        f"{case.id}: traceback:\n{out[-3000:]}"
    )
    assert B.tree_digest(tree) == before, f"{case.id}: the tree changed"
    assert B.tree_digest(outside) == outside_before, (
        f"{case.id}: something was written outside the tree: {B.tree_digest(outside)}"
    )
    assert not marker.exists(), f"{case.id}: the hostile input created {marker}"
    # text from a fix is printed escaped: no terminal control reaches the output (issue 41)
    raw = [c for c in out if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0]
    assert not raw, f"{case.id}: control characters printed raw: {sorted(set(raw))!r}"
    # nothing left behind: every fix's stage is removed, whatever its process made there
    staging = tree / ".fixpack" / "staging"
    left = sorted(p.name for p in staging.iterdir()) if staging.is_dir() else []
    assert not left, f"{case.id}: stages left behind: {left}"
    if case.mode != "lock":
        assert B.tree_digest(root) == pack_before, f"{case.id}: the pack changed"
    return r
