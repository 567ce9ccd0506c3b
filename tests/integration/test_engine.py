"""The engine on synthetic package trees: pins, order, fast path, verify, revert, failures."""

from __future__ import annotations

import json
import os
import stat

from packtests.builders import (
    DIFF_ONE,
    MOD_A,
    OTHER,
    X_B,
    apply_all,
    fixpack,
    hashes,
    make_pack,
    new_tree,
    write_fix,
    write_lock,
)


def read(tree, rel):
    return (tree / rel).read_text()


def test_apply_fixes_defaults_in_pack_order_and_pins_each_result(pack):
    root, tree = pack
    r = fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0, r.stderr
    assert "line_12 = 12  # fixed\n" in read(tree, "pkg_a/mod.py")
    assert "for pos, _ in enumerate(ids)" in read(tree, "pkg_a/sub/other.py")
    assert read(tree, "pkg_b/x.py") == X_B  # opt-in not named
    lines = [line for line in r.stdout.splitlines() if "applied" in line]
    assert [line.split(".")[0] for line in lines] == ["fix-one", "fix-two"]
    lock = json.loads((root / "profiles" / "test.lock.json").read_text())
    pins = {s["fix"]: s["files"] for s in lock["selections"][0]["steps"]}
    state = json.loads((tree / ".fixpack" / "state.json").read_text())
    assert [s["fix"] for s in state["steps"]] == ["fix-one", "fix-two"]
    for s in state["steps"]:
        assert s["files"] == pins[s["fix"]]
        assert len(s["fix_hash"]) == 64
    assert state["profile"] == "test" and state["tool_version"]


def test_opt_ins_apply_in_pack_order_whatever_the_command_line_order(tmp_path):
    root = make_pack(tmp_path / "pack", fixes=[{"id": "fix-opt", "opt_in": True}, {"id": "fix-one"}, {"id": "fix-two", "opt_in": True}])
    write_lock(root)
    tree = new_tree(root, tmp_path / "tree")
    r = fixpack("apply", "--profile", "test", "--root", str(tree), "fix-two", "fix-opt", pack=root)
    assert r.returncode == 0, r.stderr
    order = [line.split(".")[0] for line in r.stdout.splitlines() if "applied" in line]
    assert order == ["fix-opt", "fix-one", "fix-two"]


def test_unknown_opt_in_is_a_configuration_error_listing_the_valid_ones(pack):
    root, tree = pack
    r = fixpack("apply", "--profile", "test", "--root", str(tree), "no-such-fix", pack=root)
    assert r.returncode == 2
    assert "unknown opt-in fix 'no-such-fix'" in r.stderr and "fix-opt" in r.stderr
    assert hashes(tree) == hashes(root / "pristine")


def test_unknown_profile_lists_known_profiles(pack):
    root, tree = pack
    r = fixpack("apply", "--profile", "v9", "--root", str(tree), pack=root)
    assert r.returncode == 2 and "unknown profile 'v9'" in r.stderr and "test" in r.stderr


def test_rerun_is_a_no_op_that_only_hashes(pack):
    root, tree = pack
    assert fixpack("apply", "--profile", "test", "--root", str(tree), pack=root).returncode == 0
    before = {p: os.stat(tree / p).st_mtime_ns for p in ("pkg_a/mod.py", "pkg_a/sub/other.py")}
    r = apply_all("--profile", "test", "--root", str(tree), "--pack", str(root))
    assert r.returncode == 0 and "already applied" in r.stdout
    assert {p: os.stat(tree / p).st_mtime_ns for p in before} == before
    r = fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0 and "already applied" in r.stdout


def test_fast_path_imports_neither_libcst_nor_gitpython_nor_the_engine(pack):
    root, tree = pack
    assert fixpack("apply", "--profile", "test", "--root", str(tree), pack=root).returncode == 0
    import subprocess
    import sys

    from packtests.builders import REPO

    code = (
        "import runpy, sys\n"
        f"sys.argv = ['apply_all.py', '--profile', 'test', '--root', {str(tree)!r}, '--pack', {str(root)!r}]\n"
        "try:\n"
        f"    runpy.run_path({str(REPO / 'apply_all.py')!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "bad = [m for m in ('libcst', 'git', 'yaml', 'unidiff', 'fixpack.apply.engine', 'subprocess') if m in sys.modules]\n"
        "print('LOADED', bad)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "LOADED []" in r.stdout, r.stdout + r.stderr


def test_adding_an_opt_in_later_applies_only_that_fix(pack):
    root, tree = pack
    assert fixpack("apply", "--profile", "test", "--root", str(tree), pack=root).returncode == 0
    r = fixpack("apply", "--profile", "test", "--root", str(tree), "fix-opt", pack=root)
    assert r.returncode == 0, r.stderr
    assert [line.split(".")[0] for line in r.stdout.splitlines() if "applied" in line] == ["fix-opt"]
    assert read(tree, "pkg_b/x.py") == "alpha\nBETA\ngamma\n"
    # dropping it again unwinds exactly that fix
    r = fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0 and read(tree, "pkg_b/x.py") == X_B


def test_verify_reports_applied_then_drift_with_exit_5(pack):
    root, tree = pack
    fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    r = fixpack("verify", "--profile", "test", "--root", str(tree), "--json", pack=root)
    data = json.loads(r.stdout)
    assert r.returncode == 0 and not data["drift"]
    assert [f["status"] for f in data["fixes"]] == ["applied", "applied"]
    assert data["files"]["pkg_b/x.py"]["status"] == "untouched"
    assert data["files"]["pkg_a/mod.py"]["status"] == "fixed"
    with open(tree / "pkg_a" / "mod.py", "a") as f:
        f.write("# local edit\n")
    r = fixpack("verify", "--profile", "test", "--root", str(tree), "--json", pack=root)
    data = json.loads(r.stdout)
    assert r.returncode == 5 and data["drift"]
    assert data["files"]["pkg_a/mod.py"]["status"] == "drifted"
    assert [f["status"] for f in data["fixes"]] == ["drifted", "applied"]


def test_verify_detects_a_changed_untouched_file(pack):
    root, tree = pack
    (tree / "pkg_b" / "x.py").write_text("alpha\nBETA\ngamma\n")
    r = fixpack("verify", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 5 and "pkg_b/x.py" in r.stdout


def test_revert_all_gives_back_the_exact_pristine_bytes_and_modes(pack):
    root, tree = pack
    os.chmod(tree / "pkg_a" / "mod.py", 0o640)
    pristine = hashes(tree)
    assert fixpack("apply", "--profile", "test", "--root", str(tree), "fix-opt", pack=root).returncode == 0
    assert stat.S_IMODE(os.stat(tree / "pkg_a" / "mod.py").st_mode) == 0o640
    r = fixpack("revert", "--all", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0, r.stderr
    assert hashes(tree) == pristine
    assert stat.S_IMODE(os.stat(tree / "pkg_a" / "mod.py").st_mode) == 0o640
    assert json.loads((tree / ".fixpack" / "state.json").read_text())["steps"] == []


def test_revert_one_fix_leaves_the_others(pack):
    root, tree = pack
    fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    r = fixpack("revert", "fix-one", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0, r.stderr
    assert read(tree, "pkg_a/mod.py") == MOD_A
    assert "enumerate(ids)" in read(tree, "pkg_a/sub/other.py")
    assert fixpack("verify", "--profile", "test", "--root", str(tree), pack=root).returncode == 0


def test_revert_refuses_a_fix_that_a_later_fix_builds_on(tmp_path):
    root = make_pack(tmp_path / "pack", with_three=True)
    write_lock(root)
    tree = new_tree(root, tmp_path / "tree")
    assert fixpack("apply", "--profile", "test", "--root", str(tree), pack=root).returncode == 0
    assert "line_29 = 29  # fixed" in read(tree, "pkg_a/mod.py") and "line_12 = 12  # fixed" in read(tree, "pkg_a/mod.py")
    r = fixpack("revert", "fix-one", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 2 and "fix-three" in r.stderr


def test_base_mismatch_stops_before_writing_and_names_file_and_hashes(pack):
    root, tree = pack
    (tree / "pkg_a" / "sub" / "other.py").write_text(OTHER.replace("helper", "helper2"))
    snapshot = hashes(tree)
    r = fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "pkg_a/sub/other.py" in r.stderr and "expected the pristine" in r.stderr
    assert hashes(tree) == snapshot  # fix-one's file untouched too: the base check runs first


def test_base_mismatch_names_the_nearest_known_state(pack):
    root, tree = pack
    # fix-opt's result without the fixes pack order puts before it: no pinned selection has this
    (tree / "pkg_b" / "x.py").write_text("alpha\nBETA\ngamma\n")
    r = fixpack("apply", "--profile", "test", "--root", str(tree), "fix-opt", pack=root)
    assert r.returncode == 3
    assert "pkg_b/x.py" in r.stderr and "after fix-opt" in r.stderr and "nothing was changed" in r.stderr
    assert read(tree, "pkg_a/mod.py") == MOD_A


def test_missing_package_is_a_base_mismatch(pack):
    root, tree = pack
    import shutil

    shutil.rmtree(tree / "pkg_b")
    r = fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 3 and "pkg_b" in r.stderr


def test_changed_fix_without_a_new_lock_is_refused(pack):
    root, tree = pack
    d = root / "fixes" / "fix-one" / "patch.diff"
    d.write_text(DIFF_ONE.replace("# fixed", "# FIXED"))
    r = fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 2 and "changed since" in r.stderr and "fixpack lock" in r.stderr
    assert hashes(tree) == hashes(root / "pristine")


def test_revert_works_while_the_pack_is_being_changed(pack):
    """An image applied with one version of a fix can be reverted after the fix changed and
    before the lock is regenerated: revert needs only the state record and the backups."""
    root, tree = pack
    pristine = hashes(tree)
    assert fixpack("apply", "--profile", "test", "--root", str(tree), pack=root).returncode == 0
    d = root / "fixes" / "fix-one" / "patch.diff"
    d.write_text(DIFF_ONE.replace("# fixed", "# FIXED"))
    assert fixpack("apply", "--profile", "test", "--root", str(tree), pack=root).returncode == 2
    r = fixpack("revert", "--all", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert hashes(tree) == pristine


def test_stale_bytecode_of_a_rewritten_module_is_removed(pack):
    root, tree = pack
    cache = tree / "pkg_a" / "__pycache__"
    cache.mkdir()
    (cache / "mod.cpython-311.pyc").write_bytes(b"stale")
    (cache / "other_module.cpython-311.pyc").write_bytes(b"keep")
    assert fixpack("apply", "--profile", "test", "--root", str(tree), pack=root).returncode == 0
    assert not (cache / "mod.cpython-311.pyc").exists()
    assert (cache / "other_module.cpython-311.pyc").exists()


def test_list_and_show(pack):
    root, _ = pack
    r = fixpack("list", "--profile", "test", "--json", pack=root)
    data = json.loads(r.stdout)
    assert [(f["id"], f["role"]) for f in data[0]["fixes"]] == [("fix-one", "default"), ("fix-two", "default"), ("fix-opt", "opt-in")]
    r = fixpack("show", "fix-two", pack=root)
    assert r.returncode == 0 and "RowsByPosition" in r.stdout and "synthetic fix fix-two" in r.stdout
    r = fixpack("show", "nope", pack=root)
    assert r.returncode == 2 and "fix-one" in r.stderr


def test_dry_run_exits_1_when_changes_are_pending_and_writes_nothing(pack):
    root, tree = pack
    r = fixpack("apply", "--dry-run", "--profile", "test", "--root", str(tree), pack=root)
    assert r.returncode == 1 and "pending" in r.stdout
    assert hashes(tree) == hashes(root / "pristine")
    fixpack("apply", "--profile", "test", "--root", str(tree), pack=root)
    assert fixpack("apply", "--dry-run", "--profile", "test", "--root", str(tree), pack=root).returncode == 0


def test_refuses_to_run_in_a_process_that_imported_a_target(pack, monkeypatch):
    import sys
    import types

    from fixpack.apply.targets import refuse_if_imported
    from fixpack.errors import ConfigError

    monkeypatch.setitem(sys.modules, "pkg_a", types.ModuleType("pkg_a"))
    try:
        refuse_if_imported(["pkg_a", "pkg_b"])
    except ConfigError as exc:
        assert "pkg_a already imported" in str(exc)
    else:
        raise AssertionError("an imported target must be refused")


def make_port(root):
    """A port 'demo' on the synthetic profile, with one patch of its own (the layer below)."""
    import yaml


    d = root / "ports" / "demo"
    d.mkdir(parents=True)
    # a diff of the file a profile codemod also rewrites (anchored elsewhere in it)
    write_fix(d, "port-patch", "diff", ["pkg_a/sub/other.py"], "--- a/pkg_a/sub/other.py\n+++ b/pkg_a/sub/other.py\n@@ -13,2 +13,2 @@\n def helper(x):\n-    return x + 1\n+    return x + 2\n")
    (d / "port.yaml").write_text(yaml.safe_dump({"name": "demo", "profile": "test", "patches": ["port-patch"], "plugin": {"package": "demo_plugin"}}))


def test_a_port_is_the_layer_below_the_profile_and_is_never_dropped_silently(tmp_path):
    root = make_pack(tmp_path / "pack")
    make_port(root)
    write_lock(root)
    tree = new_tree(root, tmp_path / "tree")
    r = fixpack("apply", "--profile", "test", "--port", "demo", "--root", str(tree), "fix-opt", pack=root)
    assert r.returncode == 0, r.stderr
    assert [line.split(".")[0] for line in r.stdout.splitlines() if "applied" in line] == ["port-patch", "fix-one", "fix-two", "fix-opt"]
    assert "return x + 2" in read(tree, "pkg_a/sub/other.py") and "enumerate(ids)" in read(tree, "pkg_a/sub/other.py")
    r = apply_all("--profile", "test", "--port", "demo", "fix-opt", "--root", str(tree), "--pack", str(root))
    assert r.returncode == 0 and "already applied" in r.stdout
    # a container start that does not name the port keeps the one the state record shows applied
    before = hashes(tree)
    r = fixpack("apply", "--profile", "test", "--root", str(tree), "fix-opt", pack=root)
    assert r.returncode == 0 and "keeping port demo" in r.stdout and "already applied" in r.stdout, r.stdout + r.stderr
    r = apply_all("--profile", "test", "fix-opt", "--root", str(tree), "--pack", str(root))
    assert r.returncode == 0 and "port demo kept" in r.stdout, r.stdout + r.stderr
    assert hashes(tree) == before
    state = json.loads((tree / ".fixpack" / "state.json").read_text())
    assert state["port"] == "demo" and state["steps"][0]["layer"] == "port:demo"
    # without a state record the files still show the port: never unwound because a command line forgot it
    (tree / ".fixpack" / "state.json").rename(tree / ".fixpack" / "state.json.away")
    r = fixpack("apply", "--profile", "test", "--root", str(tree), "fix-opt", pack=root)
    assert r.returncode == 2 and "--port demo" in r.stderr, r.stdout + r.stderr
    assert hashes(tree) == before
    (tree / ".fixpack" / "state.json.away").rename(tree / ".fixpack" / "state.json")
    assert fixpack("revert", "--all", "--profile", "test", "--root", str(tree), pack=root).returncode == 0
    assert hashes(tree) == hashes(root / "pristine")


def test_the_lock_keeps_where_an_edit_found_its_definition_and_an_apply_uses_it(tmp_path):
    """An edit's definition is found once, when the lock is made, and kept there by the hash
    of the text; an apply on those bytes takes it from the lock (a damaged record fails the
    fix, changing nothing), and a pack without the record applies the same bytes by parsing."""
    import hashlib

    root = make_pack(tmp_path / "pack", fixes=[{"id": "fix-one"}, {"id": "fix-ed"}])
    write_fix(
        root, "fix-ed", "edit", ["pkg_a/sub/other.py"], "- {target: pkg_a/sub/other.py, in: Batch.size, replace: 'return len(self.table)', with: 'return len(self.table) + 0'}\n"
    )
    lock_path = write_lock(root)
    lock = json.loads(lock_path.read_text())
    assert lock["definitions"] == {"fix-ed": {hashlib.sha256(OTHER.encode()).hexdigest(): {"Batch.size": [9, 10]}}}
    good = new_tree(root, tmp_path / "good")
    assert fixpack("apply", "--profile", "test", "--root", str(good), pack=root).returncode == 0
    assert "return len(self.table) + 0" in read(good, "pkg_a/sub/other.py")

    # the record moved to Batch.rows: refused by the fix's process, nothing of it written
    lock["definitions"]["fix-ed"][hashlib.sha256(OTHER.encode()).hexdigest()]["Batch.size"] = [5, 7]
    lock_path.write_text(json.dumps(lock))
    bad = new_tree(root, tmp_path / "bad")
    r = fixpack("apply", "--profile", "test", "--root", str(bad), pack=root)
    assert r.returncode != 0, r.stdout
    assert "the lock's record of where Batch.size sits in pkg_a/sub/other.py" in r.stderr, r.stderr
    assert "nothing was written" in r.stderr and read(bad, "pkg_a/sub/other.py") == OTHER

    # without any record the same pinned bytes come out (the record only saves the parse)
    del lock["definitions"]
    lock_path.write_text(json.dumps(lock))
    plain = new_tree(root, tmp_path / "plain")
    assert fixpack("apply", "--profile", "test", "--root", str(plain), pack=root).returncode == 0
    assert hashes(plain) == hashes(good)
