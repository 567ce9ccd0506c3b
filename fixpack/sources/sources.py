"""Release sources materialised as scratch trees of package folders, cached by content.

- a wheel from PyPI at a version (vLLM): downloaded without dependencies, the package's
  files unzipped (compiled extensions left out, as in the Gaudi image's VLLM_TARGET_DEVICE=empty
  install), every file checked against the wheel's RECORD;
- a git repository at a commit (vllm-gaudi): from the public repository, or from a local
  clone seeded with `fixpack sources add`, read with gitpython; the tree is `git archive`d
  from the commit, so a dirty working tree never leaks in.

Cache (FIXPACK_CACHE, else $XDG_CACHE_HOME/fixpack, else ~/.cache/fixpack):
  wheels/<file>.whl          verified wheels
  git/<name>.git             bare mirrors
  trees/<id>/                extracted package trees; `.complete` is written last, so a
                             tree from a killed run is never trusted and is rebuilt
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from fixpack.apply.store import fs_error
from fixpack.errors import EnvironmentFault, SourceUnavailable

COMPLETE = ".complete"


def cache_dir() -> Path:
    env = os.environ.get("FIXPACK_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fixpack"


def _writable(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise fs_error(exc, f"the fixpack cache {path} is not writable (set FIXPACK_CACHE to another folder)") from exc
    return path


# ---------------------------------------------------------------- wheels


def _record_hash(value: str) -> str | None:
    if not value or "=" not in value:
        return None
    algo, b64 = value.split("=", 1)
    if algo != "sha256":
        return None
    return base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()


def find_cached_wheel(dist: str, version: str) -> Path | None:
    d = cache_dir() / "wheels"
    if not d.is_dir():
        return None
    prefix = f"{dist.replace('-', '_')}-{version}-"
    for p in sorted(d.glob("*.whl")):
        if p.name.startswith(prefix):
            return p
    return None


def add_wheel(path: Path) -> Path:
    """Seed the cache with a wheel file (checked before it is trusted)."""
    path = Path(path)
    if not path.is_file() or path.suffix != ".whl":
        raise SourceUnavailable(f"{path}: not a wheel file")
    _read_record(path)  # refuses corrupt or truncated wheels
    dest_dir = _writable(cache_dir() / "wheels")
    dest = dest_dir / path.name
    tmp = dest_dir / f".{path.name}.part"
    shutil.copyfile(path, tmp)
    os.replace(tmp, dest)
    return dest


def download_wheel(dist: str, version: str) -> Path:
    cached = find_cached_wheel(dist, version)
    if cached is not None:
        return cached
    dest_dir = _writable(cache_dir() / "wheels")
    with tempfile.TemporaryDirectory(dir=dest_dir, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", tmp, f"{dist}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            reason = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise SourceUnavailable(
                f"the {dist} {version} wheel could not be downloaded from the package index ({reason}). "
                f"Provide it: `pip download --no-deps {dist}=={version}` where the index is reachable, then `fixpack sources add {dist}-wheel FILE.whl`"
            )
        _read_record(wheels[0])
        final = dest_dir / wheels[0].name
        os.replace(wheels[0], final)  # the download is trusted only once it is whole and checked
        return final


def _read_record(wheel: Path) -> tuple[zipfile.ZipFile, dict[str, str | None]]:
    try:
        zf = zipfile.ZipFile(wheel)
        names = zf.namelist()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
    except (zipfile.BadZipFile, StopIteration, KeyError, OSError, EOFError, UnicodeDecodeError) as exc:
        raise SourceUnavailable(f"{wheel}: corrupt or truncated wheel ({type(exc).__name__}: {exc}); delete it and download again") from exc
    return zf, {row[0]: _record_hash(row[1]) for row in rows if row}


def wheel_tree(dist: str, version: str, package: str) -> Path:
    """The package folder of a release wheel, verified file by file against RECORD."""
    tree_id = _tree_id({"kind": "wheel", "distribution": dist, "version": version})
    root = cache_dir() / "trees" / tree_id
    if (root / COMPLETE).is_file() and (root / package).is_dir():
        return root
    wheel = download_wheel(dist, version)
    zf, record = _read_record(wheel)
    parent = _writable(cache_dir() / "trees")
    work = Path(tempfile.mkdtemp(dir=parent, prefix=f".{tree_id}-"))
    try:
        count = 0
        for info in zf.infolist():
            name = info.filename
            if not name.startswith(package + "/") or name.endswith("/"):
                continue
            if name.endswith((".so", ".pyd", ".dylib")):
                continue
            data = zf.read(info)
            want = record.get(name)
            if want is None or hashlib.sha256(data).hexdigest() != want:
                raise SourceUnavailable(f"{wheel}: {name} does not match the wheel's RECORD; the wheel is corrupt or tampered with")
            out = work / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            count += 1
        if count == 0:
            raise SourceUnavailable(f"{wheel}: no files under {package}/")
        _seal(work)
        shutil.rmtree(root, ignore_errors=True)
        os.replace(work, root)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return root


def _seal(work: Path) -> None:
    """Make cached files read-only (trees are hard-linked into scratch copies) and mark complete."""
    for dirpath, _, files in os.walk(work):
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o444)
    (work / COMPLETE).write_text("ok\n")


# ---------------------------------------------------------------- git


def mirror_path(name: str) -> Path:
    return cache_dir() / "git" / f"{name}.git"


def add_clone(name: str, path: Path) -> Path:
    """Seed (or update) the cache's bare mirror of ``name`` from a local clone."""
    import git

    src = Path(path)
    if not src.exists():
        raise SourceUnavailable(f"{src}: no such clone")
    try:
        git.Repo(src)
    except Exception as exc:  # gitpython raises several unrelated types here
        raise SourceUnavailable(f"{src}: not a git repository ({type(exc).__name__})") from exc
    mirror = mirror_path(name)
    _writable(mirror.parent)
    if not mirror.exists():
        tmp = mirror.with_name(mirror.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        git.Repo.init(tmp, bare=True)
        os.replace(tmp, mirror)
    repo = git.Repo(mirror)
    url = str(src.resolve())
    try:
        repo.git.fetch(url, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*", "--no-write-fetch-head")
    except git.GitCommandError as exc:
        # A clone with a damaged side branch: take the tags and the release lines one by one.
        first_error = (exc.stderr or str(exc)).strip().splitlines()[-1]
        listing = str(repo.git.ls_remote(url))
        refs = [line.split("\t")[1] for line in listing.splitlines() if "\t" in line]
        wanted = [r for r in refs if r.startswith("refs/tags/") or r in ("refs/heads/main", "refs/heads/master") or r.startswith("refs/heads/releases/")]
        got, skipped = 0, []
        for ref in wanted:
            if ref.endswith("^{}"):
                continue
            try:
                repo.git.fetch(url, f"+{ref}:{ref}", "--no-write-fetch-head")
                got += 1
            except git.GitCommandError:
                skipped.append(ref)
        if got == 0:
            raise SourceUnavailable(f"fetching {src} into the cache failed: {first_error}") from exc
        print(f"warning: {src}: full fetch failed ({first_error}); cached {got} tag/release refs" + (f", skipped {len(skipped)} unreadable: {', '.join(skipped[:5])}" if skipped else ""), file=sys.stderr)
    return mirror


def _has_commit(repo, commit: str) -> bool:
    import git

    try:
        return repo.git.cat_file("-t", commit).strip() == "commit"
    except git.GitCommandError:
        return False


def git_tree(name: str, commit: str, package: str, *, url: str | None = None, clone: Path | None = None) -> Path:
    """The package folder of a repository at a commit."""
    tree_id = _tree_id({"kind": "git", "repo": name, "commit": commit})
    root = cache_dir() / "trees" / tree_id
    if (root / COMPLETE).is_file() and (root / package).is_dir():
        return root
    import git

    env_clone = os.environ.get(f"FIXPACK_{name.upper().replace('-', '_')}_CLONE")
    clone = clone or (Path(env_clone) if env_clone else None)
    if clone is not None:
        add_clone(name, clone)
    mirror = mirror_path(name)
    repo = git.Repo(mirror) if mirror.exists() else None
    if repo is None or not _has_commit(repo, commit):
        if url and os.environ.get("FIXPACK_OFFLINE") != "1":
            try:
                if repo is None:
                    _writable(mirror.parent)
                    tmp = mirror.with_name(mirror.name + ".part")
                    shutil.rmtree(tmp, ignore_errors=True)
                    git.Repo.clone_from(url, tmp, bare=True, env={"GIT_TERMINAL_PROMPT": "0"})
                    os.replace(tmp, mirror)
                    repo = git.Repo(mirror)
                else:
                    repo.git.fetch(url, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*", env={"GIT_TERMINAL_PROMPT": "0"})
            except git.GitCommandError:
                pass  # reported below with what to do
        if repo is None or not _has_commit(repo, commit):
            hint = f"FIXPACK_{name.upper().replace('-', '_')}_CLONE=PATH or `fixpack sources add {name} PATH`"
            have = "the cache has no clone of it" if repo is None else f"the cached clone {mirror} does not contain it (shallow or old clone?)"
            raise SourceUnavailable(
                f"{name} commit {commit}: not available: {have}, and {url or 'no public URL'} could not be reached. Provide a clone that has it: {hint}"
            )
    parent = _writable(cache_dir() / "trees")
    work = Path(tempfile.mkdtemp(dir=parent, prefix=f".{tree_id}-"))
    try:
        data = subprocess.run(["git", "--git-dir", str(mirror), "archive", "--format=tar", commit, package], capture_output=True, check=False)
        if data.returncode != 0:
            raise SourceUnavailable(f"{name}@{commit}: git archive of {package}/ failed: {data.stderr.decode(errors='replace').strip()}")
        import tarfile

        with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tf:
            for member in tf.getmembers():
                if not member.name.startswith(package + "/") and member.name != package:
                    raise SourceUnavailable(f"{name}@{commit}: archive member {member.name} outside {package}/")
                if member.issym() or member.islnk():
                    continue  # links never enter a release tree
                tf.extract(member, work, filter="data") if hasattr(tarfile, "data_filter") else tf.extract(member, work)
        _seal(work)
        shutil.rmtree(root, ignore_errors=True)
        os.replace(work, root)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return root


def rev_parse(name: str, ref: str) -> str:
    import git

    mirror = mirror_path(name)
    if not mirror.exists():
        raise SourceUnavailable(f"no cached clone of {name}; `fixpack sources add {name} PATH`")
    try:
        return git.Repo(mirror).git.rev_parse(ref + "^{commit}").strip()
    except git.GitCommandError as exc:
        raise SourceUnavailable(f"{name}: {ref} not found in the cached clone") from exc


# ---------------------------------------------------------------- releases


def _tree_id(spec: dict) -> str:
    """The cache folder name under trees/ of one source entry."""
    if spec.get("kind") == "wheel":
        return f"wheel-{spec['distribution']}-{spec['version']}"
    if spec.get("kind") == "git":
        return f"git-{spec['repo']}-{spec['commit']}"
    raise SourceUnavailable(f"unknown source kind {spec.get('kind')!r}")


def cached_tree(package: str, spec: dict) -> Path | None:
    """The cached tree holding ``package`` for one source entry, or None when the cache does
    not hold it complete. Fetches and extracts nothing (for commands that only read)."""
    root = cache_dir() / "trees" / _tree_id(spec)
    return root if (root / COMPLETE).is_file() and (root / package).is_dir() else None


def describe(spec: dict) -> str:
    """One source entry in words: `vllm 0.26.0 (wheel)`, `vllm-gaudi v0.26.0 b059f9c95 (git)`."""
    if spec.get("kind") == "wheel":
        return f"{spec.get('distribution')} {spec.get('version')} (wheel)"
    ref = spec.get("tag") or spec.get("branch") or ""
    return f"{spec.get('repo')} {ref} {str(spec.get('commit', ''))[:9]} (git)".replace("  ", " ")


def package_tree(package: str, spec: dict) -> Path:
    """The cached tree holding ``package`` for one source entry of a profile's base."""
    kind = spec.get("kind")
    if kind == "wheel":
        return wheel_tree(spec["distribution"], str(spec["version"]), package)
    if kind == "git":
        return git_tree(spec["repo"], spec["commit"], package, url=spec.get("url"))
    raise SourceUnavailable(f"unknown source kind {kind!r} for {package}")


_SAID: set[str] = set()


def _say_once(text: str) -> None:
    if text not in _SAID:
        _SAID.add(text)
        print(f"note: {text}", file=sys.stderr, flush=True)


def release_spec(spec: dict) -> dict:
    """The entry itself, without its development base."""
    return {k: v for k, v in spec.items() if k != "development"}


def resolve(sources: dict[str, dict], packages: list[str] | None = None) -> dict[str, dict]:
    """For each package, the source the trees are built from: its release where that can be
    had, else its development base (``development:`` in the profile), said as such.

    Returns ``{package: {"base": "release" | "development", "spec": ..., "why": ...}}``."""
    out: dict[str, dict] = {}
    for package, spec in sources.items():
        if packages is not None and package not in packages:
            continue
        try:
            package_tree(package, release_spec(spec))
            out[package] = {"base": "release", "spec": release_spec(spec)}
        except SourceUnavailable as exc:
            dev = spec.get("development")
            if not dev:
                raise
            package_tree(package, release_spec(dev))  # a development base that is missing too is an error
            # the reason names no machine path: it goes into the lock and the manifest
            out[package] = {"base": "development", "spec": release_spec(dev), "why": "the release's sources could not be fetched where this was generated"}
            _say_once(f"{package}: the release the profile names is unavailable ({exc}); using its development base {dev.get('repo', dev.get('distribution'))} {dev.get('commit', dev.get('version'))}")
    return out


def test_sources(sources: dict[str, dict], package: str) -> tuple[dict[str, dict], str]:
    """The sources of a tree in which the fixes of ``package`` are tested, and its label.

    A package on its release is tested beside the other packages as the profile resolves them.
    A package on a development base that names ``imports_with`` (the releases its code imports
    with) is tested beside those instead: vllm-gaudi main, say, imports with vLLM 0.27.0 and not
    with the vLLM the release pairs it with. Its fixes' pins are unaffected: they touch only it."""
    resolved = resolve(sources)
    got = resolved[package]
    label = f"{package}: {got['base']} base {got['spec'].get('branch') or got['spec'].get('tag') or got['spec'].get('version') or ''} {str(got['spec'].get('commit') or '')[:9]}".replace("  ", " ")
    specs = {p: r["spec"] for p, r in resolved.items()}
    companions = got["spec"].get("imports_with") or {}
    for other, spec in companions.items():
        specs[other] = release_spec(spec)
        label += f", beside {other} {spec.get('version') or spec.get('commit')}"
    return specs, label


def materialise(sources: dict[str, dict], dest: Path, packages: list[str] | None = None) -> Path:
    """A scratch tree ``dest/<package>/`` for each package, hard-linked from the cache.

    fixpack only ever replaces files by rename, so hard links never write through to the cache.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for package, got in resolve(sources, packages).items():
        src_root = package_tree(package, got["spec"])
        target = dest / package
        if target.exists():
            raise EnvironmentFault(f"{target} exists already; materialise into an empty folder")

        def link(src, dst):
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
            return dst

        shutil.copytree(src_root / package, target, copy_function=link)
    return dest
