"""Release sources: wheels checked against RECORD, git trees at a commit, the cache, and the
errors for sources that are corrupt, missing or half-written."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from fixpack.errors import EnvironmentFault, SourceUnavailable
from fixpack.sources import sources


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    c = tmp_path / "cache"
    monkeypatch.setenv("FIXPACK_CACHE", str(c))
    monkeypatch.setenv("FIXPACK_OFFLINE", "1")
    return c


def rec(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(path: Path, files: dict[str, bytes], *, tamper: str | None = None) -> Path:
    record = []
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
            record.append(f"{name},{rec(data if name != tamper else b'other')},{len(data)}")
        zf.writestr("demo-1.0.dist-info/RECORD", "\n".join(record) + "\ndemo-1.0.dist-info/RECORD,,\n")
    return path


FILES = {"demo/__init__.py": b"", "demo/core.py": b"x = 1\n", "demo/_C.abi3.so": b"\x7fELF"}


def test_wheel_tree_extracts_the_package_and_checks_record(tmp_path):
    whl = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl", FILES)
    sources.add_wheel(whl)
    root = sources.wheel_tree("demo", "1.0", "demo")
    assert (root / "demo" / "core.py").read_bytes() == b"x = 1\n"
    assert not (root / "demo" / "_C.abi3.so").exists()  # compiled extensions stay out, as in the empty-target image
    assert (root / sources.COMPLETE).exists()
    # cached: a second call needs no wheel at all
    for w in (sources.cache_dir() / "wheels").glob("*.whl"):
        w.unlink()
    assert sources.wheel_tree("demo", "1.0", "demo") == root


def test_record_mismatch_is_refused_and_leaves_no_tree(tmp_path):
    whl = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl", FILES, tamper="demo/core.py")
    sources.add_wheel(whl)
    with pytest.raises(SourceUnavailable, match="does not match the wheel's RECORD"):
        sources.wheel_tree("demo", "1.0", "demo")
    trees = sources.cache_dir() / "trees"
    assert not any(p.name == "wheel-demo-1.0" for p in trees.iterdir())
    assert not any(p.name.startswith(".wheel-demo") for p in trees.iterdir())  # no half-written leftovers


def test_truncated_wheel_is_refused(tmp_path):
    whl = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl", FILES)
    data = whl.read_bytes()
    whl.write_bytes(data[: len(data) // 2])
    with pytest.raises(SourceUnavailable, match="corrupt or truncated"):
        sources.add_wheel(whl)


def test_missing_wheel_says_which_and_how_to_provide_it(monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(SourceUnavailable) as exc:
        sources.wheel_tree("demo", "9.9", "demo")
    assert "demo 9.9 wheel" in str(exc.value) and "fixpack sources add demo-wheel" in str(exc.value)


def test_a_half_written_tree_is_never_trusted(tmp_path):
    whl = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl", FILES)
    sources.add_wheel(whl)
    root = sources.cache_dir() / "trees" / "wheel-demo-1.0"
    (root / "demo").mkdir(parents=True)
    (root / "demo" / "core.py").write_bytes(b"half")  # a killed run: no .complete marker
    fresh = sources.wheel_tree("demo", "1.0", "demo")
    assert (fresh / "demo" / "core.py").read_bytes() == b"x = 1\n"


def test_read_only_cache_is_an_environment_error(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    monkeypatch.setenv("FIXPACK_CACHE", str(ro / "cache"))

    def deny(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", deny)
    with pytest.raises(EnvironmentFault, match="not writable"):
        sources.add_wheel(make_wheel(tmp_path / "demo-1.0-py3-none-any.whl", FILES))


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    git("init", "-q", "-b", "main", cwd=r)
    git("config", "user.email", "t@t", cwd=r)
    git("config", "user.name", "t", cwd=r)
    (r / "pkg").mkdir()
    (r / "pkg" / "a.py").write_text("v = 1\n")
    (r / "README").write_text("not in the tree\n")
    git("add", "-A", cwd=r)
    git("commit", "-qm", "one", cwd=r)
    first = git("rev-parse", "HEAD", cwd=r)
    (r / "pkg" / "a.py").write_text("v = 2\n")
    git("commit", "-qam", "two", cwd=r)
    return r, first, git("rev-parse", "HEAD", cwd=r)


def test_git_tree_at_a_commit_ignores_the_dirty_work_tree(repo):
    r, first, second = repo
    (r / "pkg" / "a.py").write_text("dirty\n")
    tree = sources.git_tree("demo", first, "pkg", clone=r)
    assert (tree / "pkg" / "a.py").read_text() == "v = 1\n"
    assert not (tree / "README").exists()
    assert (sources.git_tree("demo", second, "pkg") / "pkg" / "a.py").read_text() == "v = 2\n"  # from the cache now


def test_commit_that_does_not_exist_names_it_and_the_fix(repo):
    r, _, _ = repo
    sources.add_clone("demo", r)
    with pytest.raises(SourceUnavailable) as exc:
        sources.git_tree("demo", "0" * 40, "pkg")
    assert "0000000000" in str(exc.value) and "FIXPACK_DEMO_CLONE" in str(exc.value)


def test_shallow_clone_missing_the_commit_is_refused(repo, tmp_path):
    r, first, second = repo
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{r}", str(shallow)], check=True)
    with pytest.raises(SourceUnavailable, match="does not contain it"):
        sources.git_tree("demo", first, "pkg", clone=shallow)


def test_no_clone_at_all_says_how_to_provide_one():
    with pytest.raises(SourceUnavailable) as exc:
        sources.git_tree("demo", "a" * 40, "pkg", url=None)
    assert "the cache has no clone" in str(exc.value) and "fixpack sources add demo" in str(exc.value)


def test_materialised_trees_are_hard_links_that_fixpack_never_writes_through(repo, tmp_path):
    from fixpack.apply.store import atomic_write

    r, first, _ = repo
    spec = {"pkg": {"kind": "git", "repo": "demo", "commit": first}}
    sources.add_clone("demo", r)
    t = sources.materialise(spec, tmp_path / "scratch")
    cached = sources.cache_dir() / "trees" / f"git-demo-{first}" / "pkg" / "a.py"
    assert os.stat(t / "pkg" / "a.py").st_ino == os.stat(cached).st_ino
    atomic_write(t / "pkg" / "a.py", b"changed\n", like=os.stat(t / "pkg" / "a.py"))
    assert cached.read_text() == "v = 1\n"
