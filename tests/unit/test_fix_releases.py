"""fix.yaml `releases:`: one folder per fix, each release's status, its own change file only
where it differs (fixpack.pack.pack.load_fix / release_view, fixpack.apply.fastpath.fix_hash, lock carry)."""

from __future__ import annotations

import json

import pytest

from fixpack.apply.fastpath import fix_hash, hash_known
from fixpack.errors import ConfigError
from fixpack.pack.lockfile import carry_earlier
from fixpack.pack.pack import Pack, load_fix

DIFF = "--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
DIFF_NEW = "--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -2 +2 @@\n-a = 1\n+a = 2\n"


def write(tmp_path, releases: str, *, shared=True, own: dict[str, str] | None = None, name="fx"):
    d = tmp_path / "fixes" / name
    d.mkdir(parents=True)
    (d / "fix.yaml").write_text(
        f"id: {name}\nsummary: s\nwhy: w\nkind: diff\ntargets:\n  - {{package: pkg, path: m.py}}\n"
        f"upstream: null\nremove_when: never\ntests: [test_x.py]\nreleases:\n{releases}"
    )
    (d / "test_x.py").write_text("def test_x():\n    pass\n")
    if shared:
        (d / "patch.diff").write_text(DIFF)
    for rel, text in (own or {}).items():
        (d / rel).mkdir()
        (d / rel / "patch.diff").write_text(text)
    return d


def test_a_refreshed_release_reads_its_own_change_and_its_overrides(tmp_path):
    d = write(
        tmp_path,
        "  r1: {status: applies}\n  r2:\n    status: refreshed\n    why: the function moved\n    evidence: new place\n",
        own={"r2": DIFF_NEW},
    )
    r1, r2 = load_fix(d, release="r1"), load_fix(d, release="r2")
    assert r1.change_file == d / "patch.diff" and r2.change_file == d / "r2" / "patch.diff"
    assert r1.meta.get("evidence") is None and r2.meta["evidence"] == "new place"
    assert r2.status == {"status": "refreshed", "why": "the function moved", "evidence": "new place"}
    assert r1.content_hash() != r2.content_hash()
    # the container-start hash finds the same change file without parsing fix.yaml
    assert fix_hash(str(d), "r1") == r1.content_hash()
    assert fix_hash(str(d), "r2") == r2.content_hash()


@pytest.mark.parametrize(
    ("releases", "own", "shared", "says"),
    [
        (
            "  r1: {status: maybe}\n",
            None,
            True,
            r"releases\.r1\.status must be one of applies, refreshed, upstream, dropped, not-affected, found 'maybe'",
        ),
        ("  r1: applies\n", None, True, r"releases\.r1 must be a mapping such as \{status: applies\}"),
        (
            "  r1: {status: applies}\n  r2: {status: refreshed, why: moved}\n",
            None,
            True,
            r"releases\.r2: status refreshed but r2/patch\.diff does not exist",
        ),
        (
            "  r1: {status: applies}\n  r2: {status: refreshed}\n",
            {"r2": DIFF_NEW},
            True,
            r"releases\.r2: status refreshed needs key 'why'",
        ),
        (
            "  r1: {status: applies}\n  r2: {status: upstream}\n",
            None,
            True,
            r"releases\.r2: status upstream needs key 'evidence'",
        ),
        (
            "  r1: {status: applies}\n  r2: {status: dropped}\n",
            None,
            True,
            r"releases\.r2: status dropped needs key 'why'",
        ),
        (
            "  r1: {status: applies}\n  r2: {status: dropped, why: w, change: c}\n",
            None,
            True,
            r"status dropped applies no change, so key 'change'",
        ),
        (
            "  r1: {status: applies}\n  r1x: {status: applies, colour: red}\n",
            None,
            True,
            r"releases\.r1x: unknown key 'colour'",
        ),
        (
            "  r1: {status: applies}\n",
            {"r9": DIFF_NEW},
            True,
            r"r9/ holds a change file but 'releases' has no entry 'r9'",
        ),
        (
            "  r1: {status: applies}\n",
            {"r1": DIFF_NEW},
            True,
            r"releases\.r1: status applies but .*r1 holds a change file",
        ),
        ("  r2: {status: refreshed, why: w}\n", {"r2": DIFF_NEW}, True, r"patch\.diff is used by no release"),
        ("  r1: {status: applies}\n", None, False, r"a release has status applies but patch\.diff does not exist"),
        ("  {}\n", None, True, r"key 'releases' must be dict|releases' is empty"),
    ],
)
def test_a_bad_releases_table_names_the_file_and_the_item(tmp_path, releases, own, shared, says):
    d = write(tmp_path, releases, own=own, shared=shared)
    with pytest.raises(ConfigError, match=says) as exc:
        load_fix(d)
    assert str(d / "fix.yaml") in str(exc.value)


def test_a_profile_listing_a_fix_upstream_on_its_release_is_refused_with_the_evidence(tmp_path):
    write(
        tmp_path, "  r1: {status: applies}\n  r2: {status: upstream, upstream: 'PR #1', evidence: the release has it}\n"
    )
    (tmp_path / "profiles").mkdir()
    for name in ("r1", "r2", "r3"):
        (tmp_path / "profiles" / f"{name}.yaml").write_text(
            f"name: {name}\nbase: {{sources: {{}}}}\npackages: [pkg]\nfixes: [fx]\n"
        )
    pack = Pack(tmp_path)
    assert [f.id for f in pack.selection(pack.profile("r1"))] == ["fx"]
    with pytest.raises(
        ConfigError,
        match=r"fix\.yaml: releases\.r2: status upstream \(the release has it\), so no profile of r2 may list fx",
    ):
        pack.selection(pack.profile("r2"))
    with pytest.raises(
        ConfigError,
        match=r"fix\.yaml: releases has no entry 'r3' .*add `r3: \{status: applies\}`.*fixpack check --profile r3 --only fx",
    ):
        pack.selection(pack.profile("r3"))


@pytest.mark.parametrize(
    ("extra", "says"),
    [("fixes_dir: fixes-r1\n", "key 'fixes_dir' is no longer read"), ("", "key 'dir' is no longer read")],
)
def test_a_profile_of_the_old_layout_says_what_replaced_its_keys(tmp_path, extra, says):
    write(tmp_path, "  r1: {status: applies}\n")
    (tmp_path / "profiles").mkdir()
    entry = "fx" if extra else "{id: fx, dir: fixes/fx}"
    (tmp_path / "profiles" / "r1.yaml").write_text(
        f"name: r1\nbase: {{sources: {{}}}}\npackages: [pkg]\n{extra}fixes: [{entry}]\n"
    )
    with pytest.raises(ConfigError, match=says):
        Pack(tmp_path).profile("r1")


def test_the_lock_keeps_an_earlier_hash_only_while_the_fix_pins_the_same_files():
    step = {"fix": "fx", "files": {"pkg/m.py": ["a", "b"]}}
    old = {
        "format": 1,
        "fixes": {"fx": {"layer": "profile", "hash": "h0"}},
        "selections": [{"key": "-|", "steps": [step]}],
    }
    new = json.loads(json.dumps(old))
    new["fixes"]["fx"]["hash"] = "h1"
    carry_earlier(old, new)
    assert new["fixes"]["fx"]["earlier"] == ["h0"]
    assert (
        hash_known(new["fixes"]["fx"], "h0")
        and hash_known(new["fixes"]["fx"], "h1")
        and not hash_known(new["fixes"]["fx"], "h2")
    )
    # a second re-lock keeps the chain; pins that moved drop it
    newer = json.loads(json.dumps(new))
    newer["fixes"]["fx"]["hash"] = "h2"
    newer["fixes"]["fx"].pop("earlier")
    carry_earlier(new, newer)
    assert newer["fixes"]["fx"]["earlier"] == ["h0", "h1"]
    moved = json.loads(json.dumps(new))
    moved["fixes"]["fx"] = {"layer": "profile", "hash": "h3"}
    moved["selections"][0]["steps"][0]["files"]["pkg/m.py"] = ["a", "c"]
    carry_earlier(new, moved)
    assert "earlier" not in moved["fixes"]["fx"]


def test_rebase_writes_the_new_release_entry_into_fix_yaml_in_place(tmp_path):
    """`fixpack rebase-report --release NAME`: exact -> applies, offset -> refreshed with its
    own re-made diff, upstream -> the evidence; the rest of fix.yaml is kept byte for byte."""
    from fixpack.proofs.rebase import release_entry, write_release_entry

    d = write(tmp_path, "  r1: {status: applies}\n")
    (d / "fix.yaml").write_text((d / "fix.yaml").read_text().replace("releases:", "# kept comment\nreleases:"))
    before = (d / "fix.yaml").read_text()
    fix = load_fix(d, release="r1")
    row = {"class": "offset", "notes": ["pkg/m.py: hunk 1 at offset +1"], "new_change": DIFF_NEW}
    entry, change, _ = release_entry(fix, row, "r2")
    assert entry["status"] == "refreshed" and change == DIFF_NEW.encode()
    write_release_entry(fix, "r2", entry, change)
    after = (d / "fix.yaml").read_text()
    assert after.startswith(before) and (d / "r2" / "patch.diff").read_text() == DIFF_NEW
    assert load_fix(d, release="r2").change_file == d / "r2" / "patch.diff"
    # upstream: the evidence is the report's notes; exact on a shared change: applies
    up, _, _ = release_entry(fix, {"class": "upstream", "notes": ["tests without the fix: green"]}, "r3")
    assert up == {
        "status": "upstream",
        "evidence": "fixpack rebase-report (already upstream: retire): tests without the fix: green",
    }
    write_release_entry(load_fix(d, release="r1"), "r3", up, None)
    assert release_entry(fix, {"class": "exact", "notes": []}, "r4")[0] == {"status": "applies"}
    assert release_entry(fix, {"class": "conflict", "notes": ["x"]}, "r4")[0] is None
    assert list(load_fix(d).releases) == ["r1", "r2", "r3"]
    with pytest.raises(ConfigError, match="already has an entry 'r2'"):
        write_release_entry(load_fix(d, release="r1"), "r2", {"status": "applies"}, None)


def test_a_written_entry_that_does_not_validate_leaves_nothing_written(tmp_path):
    from fixpack.proofs.rebase import write_release_entry

    d = write(tmp_path, "  r1: {status: applies}\n")
    before = (d / "fix.yaml").read_bytes()
    with pytest.raises(ConfigError, match="status refreshed needs key 'why'"):
        write_release_entry(load_fix(d, release="r1"), "r2", {"status": "refreshed"}, DIFF_NEW.encode())
    assert (d / "fix.yaml").read_bytes() == before and not (d / "r2").exists()
