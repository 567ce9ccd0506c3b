"""Every fix's life complete (fixpack/pack/lives.py): an entry in fix.yaml `releases:` for every
release of the fix's layer, refused as a gap by `fixpack validate`, printed per profile by
`fixpack list`, and rendered into docs/packs.md's status tables (checked here against the files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fixpack.cli.main import main
from fixpack.pack.lives import lives, render_docs
from fixpack.pack.pack import Pack, load_fix
from packtests.builders import make_pack

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- the repository's pack


def test_every_fix_of_the_pack_records_its_life_on_every_release_of_its_layer():
    pack = Pack(REPO)
    gaps = [
        f"{life.fix_yaml.relative_to(REPO)}: {name}"
        for name in pack.profile_names()
        for life in lives(pack, name)
        if life.entry is None
    ]
    assert gaps == []
    # every fix folder of the pack is someone's life: the profile layer's on every profile, a port's on its own
    seen = {life.fix.dir for name in pack.profile_names() for life in lives(pack, name)}
    folders = {p.parent for p in (REPO / "fixes").glob("*/fix.yaml")} | {
        p.parent for p in (REPO / "ports").glob("*/fixes/*/fix.yaml")
    }
    assert seen == folders


def test_the_status_tables_of_docs_packs_md_are_what_fix_yaml_gives():
    pack = Pack(REPO)
    _, changed = render_docs(pack, REPO / "docs" / "packs.md", "docs/packs.md")
    assert changed == [], f"regenerate with `fixpack list --write-docs docs/packs.md`: {changed} differ"


def test_the_known_gaps_are_filled_from_the_release_sources():
    """synced-loader-return's wrapper is byte for byte the same on v0.30.0's development base, so it
    applies there (and the profile lists it); vllm-long-prefill-share is left out of v0.26.0, why said."""
    slr = load_fix(REPO / "fixes" / "synced-loader-return")
    assert slr.releases["v0.30.0"]["status"] == "applies" and "091bbad" in slr.releases["v0.30.0"]["evidence"]
    assert "synced-loader-return" in Pack(REPO).profile("v0.30.0").defaults
    share = load_fix(REPO / "fixes" / "vllm-long-prefill-share").releases["v0.26.0"]
    assert share["status"] == "dropped" and "v0.26.0" in share["why"] and "scheduler.py" in share["evidence"]


# ----------------------------------------------------------------------------- a synthetic pack


def _two_profiles(tmp_path) -> Path:
    """make_pack's pack ("test": fix-one, fix-two, fix-opt) and a second profile "next" listing fix-one."""
    root = make_pack(tmp_path / "pack")
    profile = yaml.safe_load((root / "profiles" / "test.yaml").read_text())
    profile.update(name="next", fixes=[{"id": "fix-one"}])
    (root / "profiles" / "next.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    _set_release(root, "fix-one", "next", {"status": "applies"})
    return root


def _set_release(root: Path, fid: str, release: str, entry: dict | None) -> None:
    path = root / "fixes" / fid / "fix.yaml"
    data = yaml.safe_load(path.read_text())
    if entry is None:
        data["releases"].pop(release, None)
    else:
        data["releases"][release] = entry
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_validate_refuses_a_fix_without_an_entry_for_a_profile_naming_the_fix_yaml_and_the_profile(tmp_path, capsys):
    root = _two_profiles(tmp_path)
    code, out, _ = _run(capsys, "validate", "--pack", str(root))
    assert code == 2
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2  # fix-two and fix-opt say nothing of "next"
    for fid in ("fix-two", "fix-opt"):
        line = next(e for e in errors if f"/fixes/{fid}/fix.yaml:" in e)
        assert f"{root / 'fixes' / fid / 'fix.yaml'}: releases has no entry 'next'" in line
        assert str(root / "profiles" / "next.yaml") in line and "dropped or not-affected with why" in line
    assert "2 error(s)" in out
    # filled: one left out on purpose, one whose release never had the defect
    _set_release(root, "fix-two", "next", {"status": "dropped", "why": "not wanted on next"})
    _set_release(
        root, "fix-opt", "next", {"status": "not-affected", "why": "next has no such code", "evidence": "pkg_b/x.py"}
    )
    code, out, _ = _run(capsys, "validate", "--pack", str(root))
    assert code == 0, out


def test_not_affected_says_why(tmp_path, capsys):
    root = _two_profiles(tmp_path)
    _set_release(root, "fix-two", "next", {"status": "dropped", "why": "w"})
    _set_release(root, "fix-opt", "next", {"status": "not-affected"})
    code, out, _ = _run(capsys, "validate", "--pack", str(root))
    assert code == 2 and "releases.next: status not-affected needs key 'why'" in out


def test_a_ports_fix_records_its_life_on_its_ports_profile(tmp_path, capsys):
    root = make_pack(tmp_path / "pack")
    port = root / "ports" / "toy"
    (port / "fixes").mkdir(parents=True)
    (port / "port.yaml").write_text("name: toy\nprofile: test\npatches: [toy-fix]\nplugin: {package: toy}\n")
    fix = port / "fixes" / "toy-fix"
    fix.mkdir()
    src = root / "fixes" / "fix-opt"
    (fix / "test_it.py").write_text((src / "test_it.py").read_text())
    data = yaml.safe_load((src / "fix.yaml").read_text())
    data.update(id="toy-fix", releases={"other": {"status": "dropped", "why": "w"}})  # no change file: none applies
    (fix / "fix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, _ = _run(capsys, "validate", "--pack", str(root))
    assert code == 2
    assert (
        f"{fix / 'fix.yaml'}: releases has no entry 'test' (the profile port toy is built on, {port / 'port.yaml'})"
        in out
    )


def test_list_prints_every_fixs_life_on_each_profile_gaps_included(tmp_path, capsys):
    root = _two_profiles(tmp_path)
    _set_release(root, "fix-two", "next", {"status": "dropped", "why": "not wanted on next"})
    code, out, _ = _run(capsys, "list", "--pack", str(root), "--profile", "next")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[2:] if line.startswith("     ")}
    assert "not listed" in rows["fix-two"] and rows["fix-two"].endswith("dropped: not wanted on next")
    assert rows["fix-opt"].endswith("no entry (fixpack validate refuses this)")
    assert "fix-one" not in rows  # listed by the profile: a numbered row
    code, out, _ = _run(capsys, "list", "--pack", str(root), "--profile", "next", "--json")
    (entry,) = json.loads(out)
    assert {x["id"]: x["status"] for x in entry["lives"]} == {
        "fix-one": "applies",
        "fix-two": "dropped",
        "fix-opt": None,
    }
    assert [x["id"] for x in entry["not_applied"]] == ["fix-two"]


DOC = """# Packs

Before.

<!-- fixpack:lives next begin -->
old
<!-- fixpack:lives next end -->

Between.

<!-- fixpack:lives test begin -->
<!-- fixpack:lives test end -->

After.
"""


def test_write_docs_renders_each_profiles_table_between_its_markers_and_check_fails_on_a_hand_edit(tmp_path, capsys):
    root = _two_profiles(tmp_path)
    _set_release(
        root, "fix-two", "next", {"status": "upstream", "upstream": "PR 1", "evidence": "It is fixed there. More."}
    )
    _set_release(root, "fix-opt", "next", {"status": "not-affected", "why": "next has no pkg_b | x. Really."})
    doc = root / "docs" / "packs.md"
    doc.parent.mkdir()
    doc.write_text(DOC)
    code, out, _ = _run(capsys, "list", "--pack", str(root), "--write-docs", str(doc), "--check")
    assert code == 9 and doc.read_text() == DOC  # check writes nothing
    code, out, _ = _run(capsys, "list", "--pack", str(root), "--write-docs", str(doc))
    assert code == 0 and "2 rewritten (next, test)" in out
    text = doc.read_text()
    assert text.startswith("# Packs\n\nBefore.\n\n") and "\n\nBetween.\n\n" in text and text.endswith("\n\nAfter.\n")
    assert "Generated by `fixpack list --write-docs docs/packs.md`" in text
    nxt = text.split("<!-- fixpack:lives next begin -->")[1].split("<!-- fixpack:lives next end -->")[0]
    assert "| `fix-one` | default | diff | pkg_a | applies | yes | synthetic fix fix-one |" in nxt
    assert "| `fix-two` | not listed | codemod | pkg_a | upstream (PR 1): It is fixed there. |" in nxt
    assert "| `fix-opt` | not listed | diff | pkg_b | not-affected: next has no pkg_b \\| x. |" in nxt
    assert "fix-two` | default" in text.split("<!-- fixpack:lives test begin -->")[1]
    code, out, _ = _run(capsys, "list", "--pack", str(root), "--write-docs", str(doc), "--check")
    assert code == 0 and "2 status table(s) match fix.yaml" in out
    doc.write_text(text.replace("It is fixed there.", "It is fixed."))  # a hand edit
    code, _, err = _run(capsys, "list", "--pack", str(root), "--write-docs", str(doc), "--check")
    assert code == 9 and "status table(s) of next are not what fix.yaml gives" in err
    # a fix.yaml edit moves the table the same way
    doc.write_text(text)
    _set_release(root, "fix-opt", "next", {"status": "dropped", "why": "changed our mind"})
    code, _, err = _run(capsys, "list", "--pack", str(root), "--write-docs", str(doc), "--check")
    assert code == 9 and "of next are not" in err


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        (
            DOC.replace("<!-- fixpack:lives test begin -->\n<!-- fixpack:lives test end -->\n", ""),
            "no status table for profile test",
        ),
        (DOC + "<!-- fixpack:lives test end -->\n", "expected one <!-- fixpack:lives test begin --> followed by one"),
        (
            DOC + "<!-- fixpack:lives v9 begin -->\n<!-- fixpack:lives v9 end -->\n",
            "status table(s) for v9, which the pack has no profile of",
        ),
    ],
)
def test_write_docs_refuses_missing_broken_or_unknown_markers_and_writes_nothing(tmp_path, capsys, doc, says):
    root = _two_profiles(tmp_path)
    _set_release(root, "fix-two", "next", {"status": "dropped", "why": "w"})
    _set_release(root, "fix-opt", "next", {"status": "dropped", "why": "w"})
    path = tmp_path / "packs.md"
    path.write_text(doc)
    code, _, err = _run(capsys, "list", "--pack", str(root), "--write-docs", str(path))
    assert code == 2 and says in err and path.read_text() == doc
