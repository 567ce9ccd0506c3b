"""fixpack.kinds.diffpatch in process: parsing and vetting a diff, exact application, the rebase
classifier, and fresh diffs that round-trip."""

from __future__ import annotations

import pytest

from fixpack.errors import ConfigError, FixFailed
from fixpack.kinds.diffpatch import apply_file_patch, parse_diff, rebase_file_patch, unified

BASE = b"".join(b"line %d\n" % i for i in range(1, 21))

DIFF = b"""--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -4,3 +4,3 @@
 line 4
-line 5
+line five
 line 6
@@ -15,3 +15,4 @@
 line 15
 line 16
+line 16.5
 line 17
"""


def test_parse_gives_paths_without_prefix_and_each_hunk_s_old_and_new_lines():
    (fp,) = parse_diff(DIFF, where="fix/patch.diff")
    assert fp.path == "pkg/mod.py"
    assert [h.header for h in fp.hunks] == ["@@ -4,3 +4,3 @@", "@@ -15,3 +15,4 @@"]
    assert fp.hunks[0].old == [b"line 4\n", b"line 5\n", b"line 6\n"]
    assert fp.hunks[0].new == [b"line 4\n", b"line five\n", b"line 6\n"]
    assert fp.hunks[1].source_start == 15 and len(fp.hunks[1].new) == 4


@pytest.mark.parametrize(
    ("diff", "says"),
    [
        (b"", "the diff is empty"),
        (DIFF.replace(b"line five", b"line\x00five"), "NUL bytes"),
        (b"Binary files a/pkg/x.bin and b/pkg/x.bin differ\n", "binary diffs are not supported"),
        (b"just some text\n", "no file sections found"),
        (DIFF.replace(b"--- a/pkg/mod.py", b"--- /dev/null"), "creates a file"),
        (DIFF.replace(b"+++ b/pkg/mod.py", b"+++ /dev/null"), "deletes a file"),
        (DIFF.replace(b"+++ b/pkg/mod.py", b"+++ b/pkg/other.py"), "renames are not supported"),
        (DIFF + DIFF, "pkg/mod.py appears twice"),
        (DIFF.replace(b"pkg/mod.py", b"../etc/mod.py"), "file header"),
        (DIFF[: DIFF.index(b" line 17")], "malformed or truncated"),
    ],
)
def test_parse_refuses_what_a_fix_may_not_be_and_names_the_file(diff, says):
    with pytest.raises(ConfigError) as exc:
        parse_diff(diff, where="fixes/x/patch.diff")
    assert str(exc.value).startswith("fixes/x/patch.diff: ") and says in str(exc.value)


def test_apply_changes_exactly_the_hunks_lines():
    (fp,) = parse_diff(DIFF, where="d")
    out = apply_file_patch(BASE, fp, where="d")
    expected = BASE.replace(b"line 5\n", b"line five\n").replace(b"line 16\n", b"line 16\nline 16.5\n")
    assert out == expected


def test_apply_refuses_a_moved_hunk_and_says_where_its_text_is_now():
    (fp,) = parse_diff(DIFF, where="d")
    moved = b"inserted\n" + BASE
    with pytest.raises(FixFailed) as exc:
        apply_file_patch(moved, fp, where="fixes/x/patch.diff")
    msg = str(exc.value)
    assert "hunk @@ -4,3 +4,3 @@ (lines 4-6) does not match at line 4" in msg
    assert "expected 'line 4', found 'line 3'" in msg
    assert "its old text occurs at line 5 instead (refresh the diff)" in msg


def test_apply_calls_repeated_old_text_ambiguous():
    (fp,) = parse_diff(DIFF, where="d")
    doubled = b"x\n" + b"line 4\nline 5\nline 6\n" * 2 + b"end\n"
    with pytest.raises(FixFailed, match=r"occurs at 2 places \(2, 5\): ambiguous"):
        apply_file_patch(doubled, fp, where="d")


def test_apply_keeps_a_last_line_without_newline():
    old = b"a\nb\nc"
    diff = unified(old, b"a\nB\nc", "pkg/m.py").encode()
    (fp,) = parse_diff(diff, where="d")
    assert apply_file_patch(old, fp, where="d") == b"a\nB\nc"


def test_rebase_classifies_exact_offset_upstream_and_conflict():
    (fp,) = parse_diff(DIFF, where="d")
    assert rebase_file_patch(BASE, fp)[0] == "exact"
    status, new, notes = rebase_file_patch(b"new 1\nnew 2\n" + BASE, fp)
    assert status == "offset" and notes == ["@@ -4,3 +4,3 @@: +2 lines", "@@ -15,3 +15,4 @@: +2 lines"]
    assert new == b"new 1\nnew 2\n" + apply_file_patch(BASE, fp, where="d")
    status, new, _ = rebase_file_patch(apply_file_patch(BASE, fp, where="d"), fp)
    assert (status, new) == ("upstream", None)
    status, new, notes = rebase_file_patch(BASE.replace(b"line 5\n", b"line V\n"), fp)
    assert (status, new) == ("conflict", None) and notes == ["@@ -4,3 +4,3 @@: old text found 0 times"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (BASE, BASE.replace(b"line 9\n", b"line nine\n")),
        # a form feed or U+2028 inside a line is text to diff(1), not a line end
        (b"a\nb = 1\x0c  # page\nc\n", b"a\nb = 2\x0c  # page\nc\n"),
        ("a\nb = '\u2028'\nc\n".encode(), "a\nb = '\u2029'\nc\n".encode()),
        (b"a\r\nb\r\nc\r\n", b"a\r\nB\r\nc\r\n"),
        (b"a\nb", b"a\nb\n"),
        (b"a\nb\n", b"a\nb"),
    ],
)
def test_a_fresh_diff_parses_and_applies_to_give_the_new_text(old, new):
    diff = unified(old, new, "pkg/m.py")
    assert diff.startswith("--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ ")
    (fp,) = parse_diff(diff.encode(), where="d")
    assert apply_file_patch(old, fp, where="d") == new
