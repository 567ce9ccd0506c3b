"""The reliability campaign's machinery, shared by the tests and bench/reliability_report.py.

- kill sweeps: enumerate the write points of a run (FIXPACK_CRASH_LOG), SIGKILL it at each
  (FIXPACK_CRASH_AT), run again, and check every file, verify and revert --all;
- resource faults: full disk, read-only tree, permission denied, targets swapped mid-run,
  state record and journal lost or corrupted; each a function that raises AssertionError;
- everything runs the CLI in its own process, as users do (builders.fixpack / fault_fixpack).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from packtests import builders as B

REPO = B.REPO
SYNTH_PACKAGES = ["pkg_a", "pkg_b"]


# ------------------------------------------------------------------ templates


_TEMPLATES: dict[str, Path] = {}
_TEMPLATE_DIR: Path | None = None


def _template_dir() -> Path:
    global _TEMPLATE_DIR
    if _TEMPLATE_DIR is None:
        _TEMPLATE_DIR = Path(tempfile.mkdtemp(prefix="fixpack-rel-templates-"))
        import atexit

        atexit.register(shutil.rmtree, _TEMPLATE_DIR, True)
    return _TEMPLATE_DIR


def template(kind: str) -> Path:
    """A locked synthetic pack, built once per process: basic (fix-one diff, fix-two codemod,
    fix-opt opt-in), codemod-first (fix-two first), chain (7 four-file fixes and a codemod)."""
    if kind not in _TEMPLATES:
        root = _template_dir() / kind
        if kind == "basic":
            B.make_pack(root)
        elif kind == "codemod-first":
            B.make_pack(root, fixes=[{"id": "fix-two"}, {"id": "fix-one"}, {"id": "fix-opt", "opt_in": True}])
        elif kind == "chain":
            B.make_chain_pack(root)
        else:
            raise ValueError(kind)
        B.write_lock(root)
        _TEMPLATES[kind] = root
    return _TEMPLATES[kind]


def copy_pack(kind: str, work: Path) -> tuple[Path, Path]:
    """(pack root, fresh pristine tree) under ``work``."""
    root = shutil.copytree(template(kind), work / "pack", symlinks=True)
    tree = shutil.copytree(root / "pristine", work / "tree", symlinks=True)
    return root, tree


def sha(path: Path) -> str | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return "not-a-file"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stray_files(tree: Path, packages: list[str]) -> list[str]:
    out = []
    for pkg in packages:
        for dirpath, _, filenames in os.walk(tree / pkg):
            out += [os.path.join(dirpath, n) for n in filenames if n.endswith(".fixpack-tmp")]
    return out


# ------------------------------------------------------------------ subjects of a kill sweep


@dataclass
class Subject:
    name: str
    pack: Path
    profile: str
    pristine: Path
    packages: list[str]
    link: bool = False  # hard-linked snapshots (the release tree is 140 MB); fixpack replaces by rename
    opt_in: list[str] = field(default_factory=list)

    @property
    def lock(self) -> dict:
        return json.loads((self.pack / "profiles" / f"{self.profile}.lock.json").read_text())

    def selection(self) -> dict:
        key = "-|" + "+".join(o for o in self.opt_in)
        return next(s for s in self.lock["selections"] if s["key"] == key)

    def allowed(self) -> dict[str, set[str]]:
        """Every state a target may be in: pristine, or the pinned result of some fix."""
        out = {rel: {h} for rel, h in self.lock["pristine"].items()}
        for s in self.selection()["steps"]:
            for rel, (before, after) in s["files"].items():
                out.setdefault(rel, set()).update({before, after})
        return out

    def final(self) -> dict[str, str]:
        out = dict(self.lock["pristine"])
        for s in self.selection()["steps"]:
            for rel, (_, after) in s["files"].items():
                out[rel] = after
        return out

    def snapshot(self, dest: Path) -> Path:
        if self.link:

            def link(src, dst):
                os.link(src, dst)
                return dst

            shutil.copytree(
                self.pristine,
                dest,
                copy_function=link,
                symlinks=True,
                ignore=shutil.ignore_patterns(".fixpack", "__pycache__"),
            )
        else:
            shutil.copytree(self.pristine, dest, symlinks=True, ignore=shutil.ignore_patterns(".fixpack"))
        return dest

    def cli(self, tree: Path, *args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
        # a generous per-fix limit: codemods on the largest release files take long on a loaded CI box
        extra = [*self.opt_in, "--timeout", "1200"] if args and args[0] == "apply" else []
        return B.fixpack(
            *args, *extra, "--profile", self.profile, "--root", str(tree), pack=self.pack, env=env, timeout=timeout
        )


def synthetic_subject(work: Path, kind: str = "chain") -> Subject:
    root = shutil.copytree(template(kind), work / f"pack-{kind}", symlinks=True)
    return Subject(f"synthetic {kind}", root, "test", root / "pristine", SYNTH_PACKAGES)


def lock_is_current(pack_root: Path, profile_name: str = "v0.26.0") -> str | None:
    """None when the committed lock pins what the pack now gives, else the reason."""
    from fixpack.apply.engine import Engine
    from fixpack.apply.store import Store
    from fixpack.errors import FixpackError
    from fixpack.pack.lockfile import Lock
    from fixpack.pack.pack import Pack

    try:
        pack = Pack(pack_root)
        profile = pack.profile(profile_name)
        Engine(pack, profile, None, [], {}, Store(Path(tempfile.gettempdir()) / "unused"), Lock.load(profile.lock_path))
    except FixpackError as exc:
        return str(exc)
    return None


def real_subject(work: Path, relock: bool = False) -> Subject:
    """The v0.26.0 profile on its pristine release tree (raises SourceUnavailable when the
    release sources are not in the fixpack cache), from a scratch copy of the pack. While
    colleagues add fixes the committed lock may lag the profile: with ``relock`` the lock is
    regenerated from the release sources in that copy (the repository's lock is never
    touched); without it, SweepUnavailable says why."""
    from fixpack.pack.pack import Pack
    from fixpack.sources.release import pristine_tree

    stale = lock_is_current(REPO)
    if stale and not relock:
        raise SweepUnavailable(
            f"the committed v0.26.0 lock does not match the profile (being regenerated?): {stale[:300]}"
        )
    # A snapshot of the pack: a sweep takes many minutes, and a fix edited (and re-locked) in
    # the repository meanwhile must not turn into failures of the points that follow.
    pack_root = work / "pack-v0.26.0"
    for sub in ("fixes", "profiles", "ports"):
        if (REPO / sub).is_dir():
            shutil.copytree(
                REPO / sub,
                pack_root / sub,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
            )
    if stale:
        r = B.fixpack("lock", "--profile", "v0.26.0", pack=pack_root, timeout=3600)
        if r.returncode != 0:
            raise SweepUnavailable(f"the v0.26.0 lock could not be regenerated: {(r.stdout + r.stderr).strip()[-400:]}")
    profile = Pack(pack_root).profile("v0.26.0")
    tree = pristine_tree(profile, work / "release")
    name = "v0.26.0 release" + (" (lock regenerated for this run)" if stale else "")
    return Subject(name, pack_root, "v0.26.0", tree, profile.packages, link=True)


# ------------------------------------------------------------------ kill sweep


class SweepUnavailable(Exception):
    pass


def enumerate_points(
    subject: Subject, work: Path, phase: str = "apply", stop_at: int | None = None
) -> list[tuple[int, str]]:
    """The write points of a run, in order. ``stop_at``: only the first ones (the run is
    killed there), which is cheap on a long profile."""
    tree = subject.snapshot(work / f"enum-{phase}-{stop_at or 0}")
    try:
        if phase == "revert":
            r = subject.cli(tree, "apply")
            if r.returncode != 0:
                raise SweepUnavailable(f"{subject.name}: apply failed ({r.returncode}): {r.stderr.strip()[-400:]}")
        log = work / f"points-{phase}.txt"
        log.unlink(missing_ok=True)
        env = {"FIXPACK_CRASH_LOG": str(log)}
        if stop_at:
            env["FIXPACK_CRASH_AT"] = str(stop_at)
        r = subject.cli(tree, *(("apply",) if phase == "apply" else ("revert", "--all")), env=env)
        if r.returncode != 0 and not (stop_at and r.returncode == -9):
            raise SweepUnavailable(f"{subject.name}: {phase} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
        points = []
        for line in log.read_text().splitlines() if log.exists() else []:
            n, label = line.split("\t", 1)
            points.append((int(n), label))
        return points
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def point_kind(label: str) -> str:
    """'staged object 1a2b…' -> 'staged object'; groups the labels for sampling."""
    for kind in (
        "staged object",
        "renamed object",
        "staged journal.json",
        "renamed journal.json",
        "journal written",
        "staged state.json",
        "renamed state.json",
        "state written",
        "journal removed",
    ):
        if label.startswith(kind):
            return kind
    return label.split(" ", 1)[0] + " target"


def sample_points(points: list[tuple[int, str]], k: int, seed: int = 0) -> list[tuple[int, str]]:
    """One point of each kind (so every kind of write is killed at least once), then random ones."""
    rng = random.Random(seed)
    by_kind: dict[str, list] = {}
    for p in points:
        by_kind.setdefault(point_kind(p[1]), []).append(p)
    reps = [rng.choice(by_kind[kind]) for kind in sorted(by_kind)]
    rng.shuffle(reps)
    chosen = set(reps[:k])  # every kind when k allows
    rest = [p for p in points if p not in chosen]
    rng.shuffle(rest)
    chosen |= set(rest[: max(0, k - len(chosen))])
    return sorted(chosen)


@dataclass
class PointResult:
    n: int
    label: str
    phase: str
    recovered: bool
    lost: list[str]
    problems: list[str]


def _check_states(subject: Subject, tree: Path, allowed: dict[str, set[str]], lost: list[str], when: str) -> None:
    for rel, ok in allowed.items():
        pkg, sub = rel.split("/", 1)
        h = sha(tree / pkg / sub)
        if h not in ok:
            lost.append(f"{rel} {when}: {str(h)[:12]} is neither pristine nor a pinned result (half-written?)")


def kill_point(
    subject: Subject, n: int, label: str, work: Path, phase: str = "apply", nested: int | None = None
) -> PointResult:
    """Kill ``phase`` at write point ``n`` (and, with ``nested``, the recovery run at its own
    write point ``nested``), run it again, then check files, verify and revert --all."""
    tree = subject.snapshot(work / f"{phase}-{n}-{nested or 0}")
    lost: list[str] = []
    problems: list[str] = []
    allowed, final = subject.allowed(), subject.final()
    targets = set(allowed)
    try:
        before = B.tree_digest(tree, content=not subject.link)
        cmd = ("apply",) if phase == "apply" else ("revert", "--all")
        if phase == "revert":
            r = subject.cli(tree, "apply")
            if r.returncode != 0:
                problems.append(f"setup apply exited {r.returncode}: {r.stderr.strip()[-300:]}")
                return PointResult(n, label, phase, False, lost, problems)
        r = subject.cli(tree, *cmd, env={"FIXPACK_CRASH_AT": str(n)})
        if r.returncode != -9:
            problems.append(f"not killed at point {n} (exit {r.returncode}): {r.stderr.strip()[-300:]}")
        _check_states(subject, tree, allowed, lost, "after the kill")
        if nested:
            r = subject.cli(tree, *cmd, env={"FIXPACK_CRASH_AT": str(nested)})
            if r.returncode not in (-9, 0):
                problems.append(f"killed recovery run exited {r.returncode}: {r.stderr.strip()[-300:]}")
            _check_states(subject, tree, allowed, lost, "after the second kill")
        r = subject.cli(tree, *cmd)
        if r.returncode != 0:
            problems.append(f"rerun of {phase} exited {r.returncode}: {(r.stdout + r.stderr).strip()[-400:]}")
            _check_states(subject, tree, allowed, lost, "after the failed rerun")
        else:
            want = final if phase == "apply" else subject.lock["pristine"]
            for rel, h in want.items():
                pkg, sub = rel.split("/", 1)
                got = sha(tree / pkg / sub)
                if got != h:
                    lost.append(f"{rel} after the rerun: {str(got)[:12]}, pinned {h[:12]}")
        stray = stray_files(tree, subject.packages)
        if stray:
            problems.append(f"temporary files left in the packages: {stray}")
        r = subject.cli(tree, "verify")
        if r.returncode != 0:
            problems.append(f"verify after the rerun exited {r.returncode}: {(r.stdout + r.stderr).strip()[-300:]}")
        if phase == "apply":
            r = subject.cli(tree, "revert", "--all")
            if r.returncode != 0:
                problems.append(f"revert --all exited {r.returncode}: {(r.stdout + r.stderr).strip()[-300:]}")
        after = B.tree_digest(tree, content=not subject.link)
        for rel in sorted(set(before) | set(after)):
            if rel in targets:
                continue
            if before.get(rel) != after.get(rel):
                lost.append(
                    f"{rel}: {'added' if rel not in before else 'removed' if rel not in after else 'changed'} ({before.get(rel)} -> {after.get(rel)})"
                )
        for rel in targets:
            pkg, sub = rel.split("/", 1)
            if sha(tree / pkg / sub) != subject.lock["pristine"][rel]:
                lost.append(f"{rel}: not the pristine bytes after revert --all")
            elif before.get(rel, ("file", None))[1] != stat.S_IMODE(os.lstat(tree / pkg / sub).st_mode):
                lost.append(f"{rel}: mode changed")
        r = subject.cli(tree, "verify")
        if r.returncode != 0:
            problems.append(f"verify after revert exited {r.returncode}")
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    return PointResult(n, label, phase, not lost and not problems, lost, problems)


@dataclass
class SweepSummary:
    subject: str
    phase: str
    points_total: int
    tried: int = 0
    recovered: int = 0
    files_lost: int = 0
    failures: list[PointResult] = field(default_factory=list)
    seconds: float = 0.0


def sweep(
    subject: Subject,
    work: Path,
    phase: str = "apply",
    sample: int | None = None,
    nested_every: int = 0,
    jobs: int = 1,
    seed: int = 0,
    progress=None,
    head: int | None = None,
) -> SweepSummary:
    """Kill ``phase`` at every write point (or a sample of them; ``head``: only among the first
    ``head`` points, which spares a full enumeration run of a long profile)."""
    points = enumerate_points(subject, work, phase, stop_at=head)
    chosen = points if sample is None else sample_points(points, sample, seed)
    summary = SweepSummary(subject.name, phase, len(points))
    t0 = time.perf_counter()
    rng = random.Random(seed)

    def one(i_p):
        i, (n, label) = i_p
        nested = rng.randint(1, 12) if nested_every and i % nested_every == 0 else None
        return kill_point(subject, n, label, work, phase, nested)

    if jobs > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(jobs) as ex:
            results = list(ex.map(one, enumerate(chosen)))
    else:
        results = []
        for item in enumerate(chosen):
            results.append(one(item))
            if progress:
                progress(results[-1])
    for res in results:
        summary.tried += 1
        summary.recovered += res.recovered
        summary.files_lost += len(res.lost)
        if not res.recovered:
            summary.failures.append(res)
    summary.seconds = time.perf_counter() - t0
    return summary


# ------------------------------------------------------------------ resource faults


class Skip(Exception):
    """The fault cannot be injected here (no mount, no chattr); the reason is the message."""


def _can_mount() -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    d = Path(tempfile.mkdtemp(prefix="fixpack-mnt-probe-"))
    try:
        ok = (
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(d)], capture_output=True).returncode
            == 0
        )
        if ok:
            subprocess.run(["umount", str(d)], capture_output=True)
        return ok
    finally:
        d.rmdir()


def _can_chattr(probe_dir: Path) -> bool:
    if not shutil.which("chattr"):
        return False
    p = probe_dir / ".chattr-probe"
    p.write_text("")
    try:
        if subprocess.run(["chattr", "+i", str(p)], capture_output=True).returncode != 0:
            return False
        subprocess.run(["chattr", "-i", str(p)], capture_output=True)
        return True
    finally:
        p.unlink(missing_ok=True)


MOUNT_OK: bool | None = None


def can_mount() -> bool:
    global MOUNT_OK
    if MOUNT_OK is None:
        MOUNT_OK = _can_mount()
    return MOUNT_OK


class Scenario:
    """A synthetic pack and tree under ``work``, and the checks every fault scenario shares."""

    def __init__(self, work: Path, kind: str = "basic"):
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.root, self.tree = copy_pack(kind, work)
        self.subject = Subject(kind, self.root, "test", self.root / "pristine", SYNTH_PACKAGES)

    def run(
        self, *args: str, faults: dict | None = None, tree: Path | None = None, extra: tuple = ()
    ) -> subprocess.CompletedProcess:
        t = tree or self.tree
        full = (*args, "--profile", "test", "--root", str(t), *extra)
        if faults is not None:
            return B.fault_fixpack(*full, pack=self.root, faults=faults)
        return B.fixpack(*full, pack=self.root)

    def digest(self, tree: Path | None = None) -> dict:
        return B.tree_digest(tree or self.tree)

    def expect(self, r: subprocess.CompletedProcess, code: int, pattern: str) -> None:
        out = r.stdout + r.stderr
        assert r.returncode == code, f"exit {r.returncode}, expected {code}:\n{out[-1500:]}"
        assert re.search(pattern, out, re.I | re.S), f"no {pattern!r} in:\n{out[-1500:]}"
        assert "Traceback" not in out, out[-2000:]

    def consistent(self, tree: Path | None = None) -> None:
        """Every target pristine or pinned, verify agrees, no temporary files."""
        t = tree or self.tree
        lost: list[str] = []
        _check_states(self.subject, t, self.subject.allowed(), lost, "after the fault")
        assert not lost, lost
        assert not stray_files(t, SYNTH_PACKAGES), stray_files(t, SYNTH_PACKAGES)
        r = self.run("verify", tree=t)
        assert r.returncode == 0, r.stdout + r.stderr

    def recovers(self, tree: Path | None = None) -> None:
        """A plain rerun completes; revert --all gives back the pristine tree."""
        t = tree or self.tree
        r = self.run("apply", tree=t)
        assert r.returncode == 0, r.stdout + r.stderr
        for rel, h in self.subject.final().items():
            assert sha(t / rel) == h, rel
        assert self.run("verify", tree=t).returncode == 0
        r = self.run("revert", "--all", tree=t)
        assert r.returncode == 0, r.stdout + r.stderr
        assert B.tree_digest(t) == B.tree_digest(self.root / "pristine"), (
            "revert --all did not give back the pristine tree"
        )


def count_writes(work: Path, kind: str = "basic") -> int:
    sc = Scenario(work / "count", kind)
    out = work / "count.txt"
    r = sc.run("apply", faults={"FAULT_COUNT": str(out)})
    assert r.returncode == 0, r.stderr
    return int(out.read_text())


def fault_errno_at(work: Path, n: int, code: int = errno.ENOSPC, sticky: bool = True, kind: str = "basic") -> str:
    """The n-th file write fails with ``code`` (and all later ones when sticky): exit 6, every
    file pristine or pinned, verify agrees; once the disk has room again a rerun completes."""
    sc = Scenario(work, kind)
    r = sc.run("apply", faults={"FAULT_ERRNO_AT": f"{n}:{code}", "FAULT_ERRNO_STICKY": "1" if sticky else "0"})
    reason = {
        errno.ENOSPC: "no space left",
        errno.EROFS: "read-only",
        errno.EACCES: "permission denied",
        errno.EDQUOT: "quota",
    }[code]
    sc.expect(r, 6, reason)
    if (sc.tree / ".fixpack" / "journal.json").exists():
        # the roll back needed the disk too: the journal stays, verify says so, the next run finishes the fix
        assert sticky and "could not roll back" in r.stdout + r.stderr, r.stdout + r.stderr
        lost: list[str] = []
        _check_states(sc.subject, sc.tree, sc.subject.allowed(), lost, "after the fault")
        assert not lost, lost
        v = sc.run("verify")
        sc.expect(v, 5, "interrupted")
        how = "journal kept (no room to roll back), verify reports it"
    else:
        sc.consistent()
        how = "rolled back"
    sc.recovers()
    return f"write {n} failed with {errno.errorcode[code]}: exit 6, {how}, recovered"


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if r.returncode != 0:
        raise Skip(f"cannot mount a tmpfs: {r.stderr.strip()}")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def full_disk_tmpfs(work: Path, free_pages: int) -> str:
    """A real full disk: the tree on a 1 MiB tmpfs filled up but for ``free_pages`` pages."""
    if not can_mount():
        raise Skip("mount is not permitted here")
    sc = Scenario(work)
    mnt = work / "mnt"
    _mount_tmpfs(mnt, "1m")
    try:
        tree = shutil.copytree(sc.tree, mnt / "tree")
        filler = mnt / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        with open(filler, "r+b") as f:
            size = max(0, os.fstat(f.fileno()).st_size - free_pages * 4096)
            f.truncate(size)
        r = sc.run("apply", tree=tree)
        out = r.stdout + r.stderr
        assert r.returncode in (0, 6), out
        assert "Traceback" not in out, out
        if r.returncode == 6:
            assert "no space left" in out, out
            assert not (tree / ".fixpack" / "journal.json").exists() or "roll back" in out, out
        sc.consistent(tree)
        filler.unlink()
        sc.recovers(tree)
        return f"tmpfs with {free_pages} free pages: exit {r.returncode}, consistent, recovered"
    finally:
        _umount(mnt)


def read_only_tree(work: Path, state_inside: bool) -> str:
    """The tree on a read-only bind mount; the state folder inside it or elsewhere."""
    if not can_mount():
        raise Skip("mount is not permitted here")
    sc = Scenario(work)
    ro = work / "ro"
    ro.mkdir()
    r = subprocess.run(["mount", "--bind", str(sc.tree), str(ro)], capture_output=True, text=True)
    if r.returncode != 0:
        raise Skip(f"bind mount failed: {r.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True, capture_output=True)
        before = sc.digest()
        extra = () if state_inside else ("--state-dir", str(work / "state"))
        r = sc.run("apply", tree=ro, extra=extra)
        sc.expect(r, 6, "read-only file system")
        assert sc.digest() == before
        assert not (work / "state" / "journal.json").exists()
        r = sc.run("verify", tree=ro, extra=extra)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        _umount(ro)
    sc.recovers()
    return f"read-only tree (state {'inside' if state_inside else 'elsewhere'}): exit 6, nothing changed"


def immutable_target(work: Path) -> str:
    """Permission denied on one target (chattr +i; root ignores file modes): the last of a
    four-file fix. The three files renamed before it are rolled back: nothing changed."""
    sc = Scenario(work, "chain")
    if not _can_chattr(sc.tree):
        raise Skip("chattr +i is not available on this file system")
    first = sc.subject.selection()["steps"][0]
    victim = sc.tree / sorted(first["files"])[-1]
    before = sc.digest()
    subprocess.run(["chattr", "+i", str(victim)], check=True)
    try:
        r = sc.run("apply")
        sc.expect(r, 6, "operation not permitted|permission denied")
        assert sc.digest() == before, "files of the failed fix must be rolled back"
        sc.consistent()
    finally:
        subprocess.run(["chattr", "-i", str(victim)], check=True)
    sc.recovers()
    return "permission denied on 1 of 4 targets (chattr +i): exit 6, 3 renamed files rolled back"


def injected_permission(work: Path) -> str:
    """Permission denied injected (EACCES) at the second target write of a four-file fix."""
    sc = Scenario(work, "chain")
    # object writes come first: 4 files x (old, new) = 8, the journal is 9; target writes 10..13
    before = sc.digest()
    r = sc.run("apply", faults={"FAULT_ERRNO_AT": "11:13"})
    sc.expect(r, 6, "permission denied")
    assert sc.digest() == before
    sc.consistent()
    sc.recovers()
    return "EACCES on the 2nd of 4 target writes: exit 6, rolled back"


def swapped_mid_run(work: Path, action: str) -> str:
    """fix-one's target replaced (by a folder, a symlink, other bytes) after the journal is
    written and before its rename: refused, nothing of the fix kept, and a rerun once the file
    is put back completes exactly."""
    sc = Scenario(work)
    target = sc.tree / "pkg_a" / "mod.py"
    outside = work / "outside.py"
    outside.write_bytes(target.read_bytes())
    out_before = outside.read_bytes()
    faults = {
        "FAULT_AT_LABEL": "journal written for apply fix-one",
        "FAULT_ACTION": f"{action}:{target}",
        "FAULT_LINK_TO": str(outside),
    }
    r = sc.run("apply", faults=faults)
    code, pat = {
        "dir": (6, "expected a regular file, found a folder"),
        "symlink": (6, "symlink"),
        "edit": (5, "changed while"),
        "rm": (6, "expected a regular file|missing|cannot"),
    }[action]
    if action == "rm":
        code, pat = 5, "changed while"
    sc.expect(r, code, pat)
    assert outside.read_bytes() == out_before, "a symlinked target must never be written through"
    assert not (sc.tree / ".fixpack" / "journal.json").exists()
    # nothing else changed, and the swapped entry is left as it was found
    assert sha(sc.tree / "pkg_a" / "sub" / "other.py") == sc.subject.lock["pristine"]["pkg_a/sub/other.py"]
    if target.is_dir() and not target.is_symlink():
        target.rmdir()
    elif target.exists() or target.is_symlink():
        target.unlink()
    target.write_bytes((sc.root / "pristine" / "pkg_a" / "mod.py").read_bytes())
    sc.recovers()
    return f"target {action} mid-run: exit {code}, nothing kept, recovered"


def swapped_before_run(work: Path, action: str) -> str:
    sc = Scenario(work)
    target = sc.tree / "pkg_a" / "mod.py"
    data = target.read_bytes()
    outside = work / "outside.py"
    outside.write_bytes(data)
    target.unlink()
    if action == "dir":
        target.mkdir()
    elif action == "symlink-inside":
        (sc.tree / "pkg_a" / "real_mod.py").write_bytes(data)
        target.symlink_to("real_mod.py")
    elif action == "symlink-outside":
        target.symlink_to(outside)
    before = sc.digest()
    r = sc.run("apply")
    sc.expect(
        r,
        6,
        {
            "dir": "found a directory",
            "symlink-inside": "found a symlink",
            "symlink-outside": "outside the package folder",
        }[action],
    )
    assert sc.digest() == before and outside.read_bytes() == data
    return f"target is a {action} before the run: exit 6, nothing changed"


def state_lost(work: Path, how: str) -> str:
    """After a full apply the state record is deleted or damaged: apply works the applied fixes
    out from the file hashes, rewrites the record, and verify and revert agree."""
    sc = Scenario(work)
    assert sc.run("apply").returncode == 0
    state = sc.tree / ".fixpack" / "state.json"
    if how == "deleted":
        state.unlink()
    elif how == "garbage":
        state.write_bytes(b"\x00\xff not json")
    elif how == "truncated":
        state.write_bytes(state.read_bytes()[: len(state.read_bytes()) // 2])
    elif how == "wrong-shape":
        state.write_text(json.dumps({"steps": "fix-one", "key": 3}))
    elif how == "list":
        state.write_text("[1, 2, 3]")
    before = sc.digest()
    if how != "deleted":
        r = sc.run("verify")
        sc.expect(r, 5, "corrupt")
    r = B.apply_all("--profile", "test", "--root", str(sc.tree), "--pack", str(sc.root))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "recovered: files match" in r.stdout, r.stdout
    assert sc.digest() == before, "recovering the state record must not touch a target"
    sc.consistent()
    r = sc.run("revert", "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert B.tree_digest(sc.tree) == B.tree_digest(sc.root / "pristine")
    return f"state record {how}: recovered from file hashes, verify and revert agree"


def state_lost_partial(work: Path) -> str:
    """Killed after fix-one was committed, then the state record deleted: the next run finds
    fix-one applied from the hashes and applies the rest."""
    sc = Scenario(work)
    pts = enumerate_points(sc.subject, work)
    n = next(i for i, label in pts if label.startswith("journal removed"))
    r = B.fixpack(
        "apply", "--profile", "test", "--root", str(sc.tree), pack=sc.root, env={"FIXPACK_CRASH_AT": str(n + 1)}
    )
    assert r.returncode == -9, r.returncode
    (sc.tree / ".fixpack" / "state.json").unlink()
    sc.recovers()
    return "state record deleted after a partial run: recovered"


def state_lies(work: Path) -> str:
    """The state record says fix-one is applied but its file is pristine: drift (5), nothing written."""
    sc = Scenario(work)
    assert sc.run("apply").returncode == 0
    (sc.tree / "pkg_a" / "mod.py").write_bytes((sc.root / "pristine" / "pkg_a" / "mod.py").read_bytes())
    before = sc.digest()
    r = sc.run("apply")
    sc.expect(r, 5, "someone edited it")
    assert sc.digest() == before
    return "state record disagrees with a file: exit 5, nothing changed"


def journal_damaged(work: Path, how: str) -> str:
    sc = Scenario(work)
    (sc.tree / ".fixpack").mkdir()
    j = sc.tree / ".fixpack" / "journal.json"
    j.write_bytes(b"{not json" if how == "garbage" else json.dumps({"op": "apply", "step": 1, "files": "x"}).encode())
    before = sc.digest()
    r = sc.run("apply")
    sc.expect(r, 5, "journal.json is unreadable")
    assert sc.digest() == before
    j.unlink()
    sc.recovers()
    return f"journal {how}: exit 5 naming it, nothing changed"


def backups_damaged(work: Path, how: str) -> str:
    sc = Scenario(work)
    assert sc.run("apply").returncode == 0
    objects = sc.tree / ".fixpack" / "objects"
    for p in objects.rglob("*"):
        if p.is_file():
            if how == "deleted":
                p.unlink()
            else:
                p.write_bytes(b"tampered")
    before = sc.digest()
    r = sc.run("revert", "--all")
    sc.expect(r, 5, "missing" if how == "deleted" else "corrupt")
    assert sc.digest() == before
    return f"backups {how}: revert refuses (exit 5), nothing changed"


def held_lock(work: Path) -> str:
    """Another process holds the lock past --lock-wait: exit 7, nothing changed."""
    sc = Scenario(work)
    (sc.tree / ".fixpack").mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl,os,sys,time\nfd=os.open(sys.argv[1],os.O_RDWR|os.O_CREAT)\nfcntl.flock(fd,fcntl.LOCK_EX)\nprint('held',flush=True)\ntime.sleep(60)",
            str(sc.tree / ".fixpack" / "lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        holder.stdout.readline()
        before = sc.digest()
        r = sc.run("apply", extra=("--lock-wait", "1"))
        sc.expect(r, 7, "another fixpack run holds")
        assert sc.digest() == before
    finally:
        holder.kill()
        holder.wait()
    sc.recovers()
    return "lock held by another process: exit 7 after --lock-wait, nothing changed"


def leftovers_of_a_crash(work: Path) -> str:
    """A temporary file of a killed run (garbage bytes) beside a target: the next run replaces it."""
    sc = Scenario(work)
    (sc.tree / "pkg_a" / ".mod.py.fixpack-tmp").write_bytes(b"half a file")
    r = sc.run("apply")
    assert r.returncode == 0, r.stderr
    assert not stray_files(sc.tree, SYNTH_PACKAGES)
    sc.consistent()
    return "temporary file of a killed run: replaced, not left behind"


def fast_path_garbage_state(work: Path) -> str:
    sc = Scenario(work)
    assert sc.run("apply").returncode == 0
    (sc.tree / ".fixpack" / "state.json").write_text(json.dumps(["not", "a", "record"]))
    r = B.apply_all("--profile", "test", "--root", str(sc.tree), "--pack", str(sc.root))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    sc.consistent()
    return "fast path given a malformed state record: falls back to the engine, recovers"


def planted_temp_symlink(work: Path) -> str:
    """Someone who can write in the package folder plants a symlink at the engine's temporary
    name (.mod.py.fixpack-tmp -> a file outside). The engine must never open it: the outside
    file keeps its bytes, mode and owner, and the target ends a regular file at its pin."""
    sc = Scenario(work)
    victim = work / "victim.txt"
    victim.write_bytes(b"do not touch\n")
    os.chmod(victim, 0o600)
    (sc.tree / "pkg_a" / ".mod.py.fixpack-tmp").symlink_to(victim)
    r = sc.run("apply")
    assert r.returncode == 0, r.stdout + r.stderr
    assert victim.read_bytes() == b"do not touch\n" and stat.S_IMODE(os.stat(victim).st_mode) == 0o600
    assert not (sc.tree / "pkg_a" / "mod.py").is_symlink()
    sc.consistent()
    return "symlink planted at the temporary name: removed, never written through"


def setuid_mode_kept(work: Path) -> str:
    """Mode bits (setgid/setuid and sticky included) and owner survive apply and revert."""
    sc = Scenario(work)
    p = sc.tree / "pkg_a" / "mod.py"
    os.chown(p, 1234, 5678) if os.geteuid() == 0 else None
    os.chmod(p, 0o6751)
    want = (stat.S_IMODE(os.stat(p).st_mode), os.stat(p).st_uid, os.stat(p).st_gid)
    assert sc.run("apply").returncode == 0
    got = (stat.S_IMODE(os.stat(p).st_mode), os.stat(p).st_uid, os.stat(p).st_gid)
    assert got == want, (oct(got[0]), got[1:], oct(want[0]), want[1:])
    assert sc.run("revert", "--all").returncode == 0
    got = (stat.S_IMODE(os.stat(p).st_mode), os.stat(p).st_uid, os.stat(p).st_gid)
    assert got == want, (oct(got[0]), got[1:])
    return "mode 6751 and owner 1234:5678 kept through apply and revert"


def fault_scenarios() -> list[tuple[str, callable]]:
    """Every named fault scenario (the injected ENOSPC sweep is separate: fault_errno_at)."""
    return [
        ("full disk: tmpfs, no free page", lambda w: full_disk_tmpfs(w, 0)),
        ("full disk: tmpfs, 1 free page", lambda w: full_disk_tmpfs(w, 1)),
        ("full disk: tmpfs, 2 free pages", lambda w: full_disk_tmpfs(w, 2)),
        ("full disk: tmpfs, 4 free pages", lambda w: full_disk_tmpfs(w, 4)),
        ("full disk: tmpfs, 6 free pages", lambda w: full_disk_tmpfs(w, 6)),
        ("disk quota (EDQUOT) once", lambda w: fault_errno_at(w, 3, errno.EDQUOT, sticky=False)),
        ("read-only file system (EROFS) injected", lambda w: fault_errno_at(w, 1, errno.EROFS)),
        ("read-only tree, state inside", lambda w: read_only_tree(w, True)),
        ("read-only tree, state elsewhere", lambda w: read_only_tree(w, False)),
        ("permission denied on one target (chattr +i)", immutable_target),
        ("permission denied injected (EACCES)", injected_permission),
        ("target replaced by a folder mid-run", lambda w: swapped_mid_run(w, "dir")),
        ("target replaced by a symlink mid-run", lambda w: swapped_mid_run(w, "symlink")),
        ("target edited mid-run", lambda w: swapped_mid_run(w, "edit")),
        ("target removed mid-run", lambda w: swapped_mid_run(w, "rm")),
        ("target is a folder", lambda w: swapped_before_run(w, "dir")),
        ("target is a symlink inside the package", lambda w: swapped_before_run(w, "symlink-inside")),
        ("target is a symlink out of the package", lambda w: swapped_before_run(w, "symlink-outside")),
        ("state record deleted", lambda w: state_lost(w, "deleted")),
        ("state record garbage bytes", lambda w: state_lost(w, "garbage")),
        ("state record truncated", lambda w: state_lost(w, "truncated")),
        ("state record wrong shape", lambda w: state_lost(w, "wrong-shape")),
        ("state record a JSON list", lambda w: state_lost(w, "list")),
        ("state record deleted after a partial run", state_lost_partial),
        ("state record contradicts a file", state_lies),
        ("journal garbage", lambda w: journal_damaged(w, "garbage")),
        ("journal wrong shape", lambda w: journal_damaged(w, "wrong-shape")),
        ("backups deleted", lambda w: backups_damaged(w, "deleted")),
        ("backups corrupted", lambda w: backups_damaged(w, "corrupted")),
        ("lock held by another process", held_lock),
        ("temporary file left by a killed run", leftovers_of_a_crash),
        ("fast path given a malformed state record", fast_path_garbage_state),
        ("symlink planted at the temporary name", planted_temp_symlink),
        ("setuid/setgid mode and owner kept", setuid_mode_kept),
    ]


# ------------------------------------------------------------------ concurrency


def _start(sc: Scenario, args: list[str], env: dict | None = None, entry: str = "fixpack") -> subprocess.Popen:
    e = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(REPO), **(env or {}))
    if entry == "apply_all":
        cmd = [
            sys.executable,
            str(REPO / "apply_all.py"),
            "--profile",
            "test",
            "--root",
            str(sc.tree),
            "--pack",
            str(sc.root),
        ]
    else:
        cmd = [
            sys.executable,
            "-m",
            "fixpack",
            *args,
            "--profile",
            "test",
            "--root",
            str(sc.tree),
            "--pack",
            str(sc.root),
        ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=REPO)


def _wait_all(procs: list[subprocess.Popen], bound: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + bound
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"deadlock or starvation: runs still going after {bound:.0f} s") from None
        out.append((p.returncode, o + e))
    return out


def concurrent_apply(work: Path, n: int = 8, entry: str = "fixpack", bound: float = 300) -> str:
    """n apply runs started at once on one tree: exactly one applies each fix, the others wait
    and report it applied; all exit 0 within ``bound`` seconds; the final state is exact."""
    sc = Scenario(work)
    t0 = time.monotonic()
    results = _wait_all([_start(sc, ["apply"], entry=entry) for _ in range(n)], bound)
    took = time.monotonic() - t0
    for rc, out in results:
        assert rc == 0 and "Traceback" not in out, out
    for fid in ("fix-one", "fix-two"):
        appliers = sum(1 for _, out in results if re.search(rf"^{fid}\.+applied", out, re.M))
        assert appliers == 1, f"{fid} applied by {appliers} runs:\n" + "\n---\n".join(o for _, o in results)
    waited = sum(1 for _, out in results if "already applied" in out)
    assert waited == n - 1, [o for _, o in results]
    for rel, h in sc.subject.final().items():
        assert sha(sc.tree / rel) == h, rel
    sc.consistent()
    return f"{n} concurrent {entry} runs: 1 applied, {waited} reported it applied, {took:.1f} s"


def concurrent_apply_and_revert(work: Path, n: int = 8, bound: float = 300) -> str:
    """Half apply, half revert --all, all at once: each run sees a whole state, never half of one."""
    sc = Scenario(work)
    procs = [_start(sc, ["apply"] if i % 2 == 0 else ["revert", "--all"]) for i in range(n)]
    results = _wait_all(procs, bound)
    for rc, out in results:
        assert rc == 0 and "Traceback" not in out, out
    final, pristine = sc.subject.final(), sc.subject.lock["pristine"]
    got = {rel: sha(sc.tree / rel) for rel in final}
    assert got == final or got == pristine, got
    sc.consistent()
    return (
        f"{n // 2} apply + {n // 2} revert --all at once: ended {'applied' if got == final else 'pristine'}, consistent"
    )


def concurrent_with_a_killed_holder(work: Path, n: int = 8, bound: float = 300) -> str:
    """One of n runs is SIGKILLed mid-commit while holding the lock: the lock dies with it, and
    a waiting run finishes the interrupted fix from the journal."""
    sc = Scenario(work)
    pts = enumerate_points(sc.subject, work)
    k = next(i for i, label in pts if label.startswith("renamed pkg_a/mod.py"))
    first = _start(sc, ["apply"], env={"FIXPACK_CRASH_AT": str(k)})
    deadline = time.monotonic() + 60
    while not (sc.tree / ".fixpack" / "staging").exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # it holds the lock once it stages its first fix
    procs = [first] + [_start(sc, ["apply"]) for _ in range(n - 1)]
    results = _wait_all(procs, bound)
    killed = [rc for rc, _ in results if rc == -9]
    assert len(killed) == 1, [rc for rc, _ in results]
    assert any("recovering an interrupted run" in out for _, out in results), [o for _, o in results]
    others = [(rc, out) for rc, out in results if rc != -9]
    assert all(rc == 0 for rc, _ in others), others
    for rel, h in sc.subject.final().items():
        assert sha(sc.tree / rel) == h, rel
    sc.consistent()
    return f"{n} runs, {len(killed)} killed holding the lock: the others finished, state exact"


def concurrency_scenarios() -> list[tuple[str, callable]]:
    return [
        ("8 x fixpack apply at once", lambda w: concurrent_apply(w, 8, "fixpack")),
        ("8 x apply_all.py at once", lambda w: concurrent_apply(w, 8, "apply_all")),
        ("4 apply + 4 revert --all at once", concurrent_apply_and_revert),
        ("8 runs, the lock holder killed mid-commit", concurrent_with_a_killed_holder),
    ]
