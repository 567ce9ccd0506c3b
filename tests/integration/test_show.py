"""fixpack show: the unified diff a fix makes on its pinned release, from the release-source
cache, whatever its kind; and a plain word when the cache lacks the release."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from fixpack.cli.main import main
from packtests.builders import make_pack, pristine_source, write_lock

SOURCES = {
    "pkg_a": {"kind": "wheel", "distribution": "pkg-a", "version": "1.0"},
    "pkg_b": {"kind": "wheel", "distribution": "pkg-b", "version": "1.0"},
}


@pytest.fixture()
def cached(tmp_path, monkeypatch):
    """The synthetic pack on a profile whose base names one wheel per package, with the cache
    holding their extracted trees as `fixpack sources` leaves them."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FIXPACK_CACHE", str(cache))
    root = make_pack(tmp_path / "pack", with_three=True)
    path = root / "profiles" / "test.yaml"
    profile = yaml.safe_load(path.read_text())
    profile["base"]["sources"] = SOURCES
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    src = pristine_source(root)
    for package, spec in SOURCES.items():
        tree = cache / "trees" / f"wheel-{spec['distribution']}-{spec['version']}"
        shutil.copytree(src / package, tree / package)
        (tree / ".complete").write_text("")
    write_lock(root)
    return root, cache


def show(root, *args, capsys):
    rc = main(["show", *args, "--pack", str(root)])
    return rc, capsys.readouterr().out


def test_show_prints_the_diff_a_codemod_makes_on_the_cached_release(cached, capsys):
    root, _ = cached
    rc, out = show(root, "fix-two", capsys=capsys)
    assert rc == 0
    diff = out.split("pinned release:\n", 1)[1]
    assert diff.startswith("\n--- a/pkg_a/sub/other.py\n+++ b/pkg_a/sub/other.py\n@@ ")
    assert "\n-        return [self.table[i] for i in ids]\n" in diff
    assert "\n+        return [self.table[pos] for pos, _ in enumerate(ids)]\n" in diff
    assert "the text it meets and its output are the lock's pinned bytes" in out
    assert "class RowsByPosition(Codemod)" in out  # a codemod's own source follows its diff


def test_show_makes_a_later_fix_s_diff_on_the_text_the_earlier_fixes_leave(cached, capsys):
    root, _ = cached
    rc, out = show(root, "fix-three", "--json", capsys=capsys)
    assert rc == 0
    shown = json.loads(out)["release_diff"]
    assert shown["after"] == ["fix-one"] and shown["pin_problems"] == []
    # the text it met was fix-one's output (no pin problem says so), and its diff is its own
    assert shown["diff"].startswith("--- a/pkg_a/mod.py\n+++ b/pkg_a/mod.py\n")
    assert "-line_29 = 29\n+line_29 = 29  # fixed\n" in shown["diff"]
    assert "line_12" not in shown["diff"]


def test_show_says_when_its_input_is_not_the_pinned_text(cached, capsys):
    root, cache = cached
    # a cache tree whose file differs from the release the lock was made from
    target = cache / "trees" / "wheel-pkg-a-1.0" / "pkg_a" / "mod.py"
    target.write_text(target.read_text().replace("line_1 = 1\n", "line_1 = 100\n"))
    rc, out = show(root, "fix-one", capsys=capsys)
    assert rc == 0
    assert "!!! not the pinned change: pkg_a/mod.py: the text it meets is not the pinned one" in out
    assert "lock's pinned bytes" not in out


def test_show_says_when_the_cache_lacks_the_release_and_still_shows_the_rest(cached, capsys):
    root, cache = cached
    shutil.rmtree(cache / "trees" / "wheel-pkg-a-1.0")
    rc, out = show(root, "fix-one", capsys=capsys)
    assert rc == 0
    assert "!!! the diff on the pinned release is not shown: " in out
    assert "does not hold pkg_a from pkg-a 1.0 (wheel)" in out
    assert "synthetic fix fix-one" in out and "targets: pkg_a/mod.py" in out
    assert "\n--- patch.diff\n--- a/pkg_a/mod.py\n" in out  # the change as written, in its place
    rc, out = show(root, "fix-opt", capsys=capsys)  # pkg_b's tree is still cached
    assert rc == 0 and "\n-beta\n+BETA\n" in out and "not shown" not in out


def test_show_json_says_the_cache_lacks_the_release(cached, capsys):
    root, cache = cached
    shutil.rmtree(cache / "trees")
    rc, out = show(root, "fix-two", "--json", capsys=capsys)
    shown = json.loads(out)["release_diff"]
    assert rc == 0 and shown["diff"] is None and "does not hold pkg_a" in shown["unavailable"]


@pytest.mark.release
@pytest.mark.parametrize("profile_name", ["v0.26.0", "v0.30.0"])
def test_every_pinned_selection_s_diffs_give_the_lock_s_bytes(profile_name):
    """The diffs `show` prints, for every fix and port patch of the real pack, are made on the
    pinned text and give the pinned output."""
    from fixpack.errors import SourceUnavailable
    from fixpack.pack.lockfile import Lock
    from fixpack.pack.pack import Pack, default_pack_root
    from fixpack.proofs.changes import chain_changes

    pack = Pack(default_pack_root())
    profile = pack.profile(profile_name)
    lock = Lock.load(profile.lock_path)
    for sel in lock.data["selections"]:
        try:
            changes = chain_changes(pack, profile, lock, key=sel["key"])
        except SourceUnavailable as exc:
            pytest.skip(str(exc))
        assert [c.fix for c in changes] == [s["fix"] for s in sel["steps"]]
        for c in changes:
            assert c.pin_problems == [], (sel["key"], c.fix)
            assert c.diff.startswith("--- a/") and "\n+" in c.diff, (sel["key"], c.fix)
