"""fixpack.cli.output.printable: text a fix provided is printed with every control character
escaped (issue 41, item 7), so that nothing it holds acts on the terminal or passes for one of
fixpack's own lines. The rule is checked over every character that is not printable text, not
only the escape sequences that were tried first."""

from __future__ import annotations

import unicodedata

import pytest

from fixpack.cli.output import printable

ATTACKS = {
    "clear-screen": "\x1b[2J\x1b[H",
    "cursor-up-and-overwrite": "\x1b[1A\r\x1b[2Kfix-one.................................applied",
    "forged-line": "\nfix-two.................................already applied",
    "osc52-clipboard": "\x1b]52;c;ZWNobyBwd25lZA==\x07",
    "c1-csi": "\x9b2J",
    "bidi-override": "safe\u202etxt.exe",
    "carriage-return": "ok\rpwned",
    "nul-and-del": "a\x00b\x7fc",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("lines", [False, True])
def test_no_control_character_survives(name, lines):
    out = printable(ATTACKS[name], lines=lines)
    bad = [
        c for c in out if c != "\n" and (unicodedata.category(c) in ("Cc", "Zl", "Zp") or 0x202A <= ord(c) <= 0x202E)
    ]
    assert not bad, repr(out)
    if not lines:
        assert "\n" not in out
    else:  # every line of it marked as the fix's, so none can pass for fixpack's own
        assert all(line.startswith("  | ") for line in out.split("\n"))


def test_every_control_character_is_escaped_and_printable_text_is_kept():
    for code in list(range(0x20)) + list(range(0x7F, 0xA0)):
        c = chr(code)
        if c == "\t":
            assert printable(c) == "\t"
            continue
        assert printable(c) == f"\\x{code:02x}", code
    text = "fix tried to write /tmp/x — naïve 中文 'quotes' {braces} tab\there"
    assert printable(text) == text


def test_lines_keep_their_breaks_and_escape_the_rest():
    assert printable("one\x1b[31m\ntwo\r", lines=True) == "  | one\\x1b[31m\n  | two\\x0d"
    assert printable("one\ntwo") == "one\\x0atwo"
