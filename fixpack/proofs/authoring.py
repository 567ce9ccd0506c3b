"""Writing a fix the way pnpm patch and patch-package let users write theirs.

``prepare`` builds a workspace ``.fixpack-work/edit/<id>/`` in the pack: ``base/``, the package
folders at the state the fix meets in the pack order (the release with every earlier fix of its
selection applied), and ``tree/``, a copy to edit (for a fix that exists, with that fix applied,
so the author changes its result). ``commit`` compares the two: for a diff fix (or a new one)
it writes ``patch.diff`` (checked by applying it back to ``base/``), for a new fix also a
``fix.yaml`` skeleton with the targets filled, a failing test stub and the profile entry; for a
codemod it checks that the codemod gives exactly the edited files. Then it re-locks.

Both trees are real copies, never hard links into the release cache: an editor that writes in
place must not change the cache.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fixpack import kinds
from fixpack.errors import CheckFailed, ConfigError, FixFailed
from fixpack.pack import schema
from fixpack.pack.pack import Fix, Pack, Port, Profile

WORK = Path(".fixpack-work") / "edit"


@dataclass
class Workspace:
    dir: Path

    @property
    def base(self) -> Path:
        return self.dir / "base"

    @property
    def tree(self) -> Path:
        return self.dir / "tree"

    @property
    def meta_path(self) -> Path:
        return self.dir / "edit.json"

    def meta(self) -> dict:
        try:
            return json.loads(self.meta_path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{self.meta_path}: not a workspace made by `fixpack edit` ({exc})") from None


def workspace(pack: Pack, fix_id: str) -> Workspace:
    return Workspace(pack.root / WORK / fix_id)


@dataclass
class Place:
    """Where a fix sits: its selection, the fixes before it, and the fix itself (None: new)."""

    port: Port | None
    opt_ins: list[str]
    before: list[Fix]
    fix: Fix | None


def locate_fix(pack: Pack, profile: Profile, fix_id: str, port: Port | None) -> Place:
    schema.check_slug(fix_id, where="fix id")
    ids = [e.id for e in profile.entries]
    if port is None:
        for name in pack.port_names():
            other = pack.port(name)
            if other.profile == profile.name and fix_id in other.patches:
                raise ConfigError(f"{fix_id} is a patch of port {name}; add --port {name}")
    if port is not None and fix_id in port.patches:
        selection = pack.selection(profile, [], port)
        opt_ins: list[str] = []
    elif fix_id in ids:
        if port is not None:
            raise ConfigError(f"{fix_id} is a fix of profile {profile.name}, not a patch of port {port.name}; leave out --port")
        opt_ins = [fix_id] if fix_id in profile.opt_ins else []
        selection = pack.selection(profile, opt_ins)
    else:  # a new fix: after every default fix of the profile (or every patch of the port)
        selection = pack.selection(profile, [], port)
        if port is not None:
            selection = [f for f in selection if f.layer != "profile"]
        return Place(port, [], selection, None)
    i = [f.id for f in selection].index(fix_id)
    return Place(port, opt_ins, selection[:i], selection[i])


def _copy_packages(src: Path, dest: Path, packages: list[str]) -> None:
    for pkg in packages:
        if not (src / pkg).is_dir():
            raise ConfigError(f"{src}: has no package folder {pkg}")
        shutil.copytree(src / pkg, dest / pkg, symlinks=True, copy_function=shutil.copy2)


def _engine(pack: Pack, profile: Profile, place: Place, tree: Path, state: Path):
    from fixpack.apply.engine import Engine
    from fixpack.apply.store import Store
    from fixpack.cli.output import Lines

    found = {p: tree / p for p in profile.packages}
    return Engine(pack, profile, place.port, place.opt_ins, found, Store(state), None, report=Lines(quiet=True))


def _apply(engine, fixes: list[Fix]) -> None:
    steps: list = []
    try:
        for fix in fixes:
            steps = engine.apply_one(fix, steps, None)
        engine.check_run()
    finally:
        engine.close()


def prepare(pack: Pack, profile: Profile, fix_id: str, port: Port | None = None, pristine: Path | None = None, *, replace: bool = False) -> Workspace:
    """Make the workspace; ``pristine``: a folder holding the release's package folders (default:
    the release cache)."""
    from fixpack.sources import release

    place = locate_fix(pack, profile, fix_id, port)
    ws = workspace(pack, fix_id)
    if ws.dir.exists():
        if not replace:
            raise ConfigError(f"{ws.dir} exists (an edit in progress); `fixpack commit {fix_id}` it, or start again with --replace")
        shutil.rmtree(ws.dir)
    ws.dir.mkdir(parents=True)
    try:
        with tempfile.TemporaryDirectory(prefix="fixpack-edit-") as tmp:
            src = pristine if pristine is not None else release.pristine_tree(profile, Path(tmp))
            _copy_packages(src, ws.base, profile.packages)
        _apply(_engine(pack, profile, place, ws.base, ws.dir / "state-base"), place.before)
        _copy_packages(ws.base, ws.tree, profile.packages)
        if place.fix is not None:
            _apply(_engine(pack, profile, place, ws.tree, ws.dir / "state-tree"), [place.fix])
        for d in ("state-base", "state-tree"):
            shutil.rmtree(ws.dir / d, ignore_errors=True)
        ws.meta_path.write_text(json.dumps({
            "fix": fix_id,
            "profile": profile.name,
            "port": port.name if port else None,
            "kind": place.fix.kind if place.fix else None,
            "before": [f.id for f in place.before],
            "pristine": str(pristine) if pristine is not None else None,
        }, indent=1) + "\n")
    except BaseException:
        shutil.rmtree(ws.dir, ignore_errors=True)
        raise
    return ws


def tree_changes(ws: Workspace, packages: list[str]) -> tuple[dict[str, tuple[bytes, bytes]], list[str], list[str]]:
    """(modified {rel: (base bytes, edited bytes)}, added, removed), every path package-relative."""

    def files(root: Path) -> dict[str, Path]:
        out = {}
        for pkg in packages:
            for dirpath, dirnames, names in os.walk(root / pkg):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                for n in names:
                    p = Path(dirpath) / n
                    out[p.relative_to(root).as_posix()] = p
        return out

    a, b = files(ws.base), files(ws.tree)
    modified = {}
    for rel in sorted(set(a) & set(b)):
        pa, pb = a[rel], b[rel]
        sa, sb = pa.lstat(), pb.lstat()
        if sa.st_size == sb.st_size and sa.st_mtime_ns == sb.st_mtime_ns:
            continue  # copy2 kept the mtime: an untouched copy
        old, new = pa.read_bytes(), pb.read_bytes()
        if old != new:
            modified[rel] = (old, new)
    return modified, sorted(set(b) - set(a)), sorted(set(a) - set(b))


def make_diff(modified: dict[str, tuple[bytes, bytes]]) -> bytes:
    """A unified diff in the pack's form (headers a/<package>/<path>, b/<package>/<path>), checked
    by applying it back: it must turn every base file into the edited one exactly."""
    from fixpack.kinds.diffpatch import apply_file_patch, parse_diff

    out: list[str] = []
    for rel, (old, new) in sorted(modified.items()):
        try:
            a, b = old.decode("utf-8"), new.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{rel}: not UTF-8 text; a diff fix changes text files only") from None
        if (a and not a.endswith("\n")) or (b and not b.endswith("\n")):
            raise ConfigError(f"{rel}: has no newline at its end; a diff fix needs one on both sides")
        out += difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True), f"a/{rel}", f"b/{rel}", n=3)
    data = "".join(line if line.endswith("\n") else line + "\n" for line in out).encode("utf-8")
    patches = {fp.path: fp for fp in parse_diff(data, where="the generated diff")}
    for rel, (old, new) in modified.items():
        if apply_file_patch(old, patches[rel], where="the generated diff") != new:
            raise CheckFailed(f"{rel}: the generated diff does not reproduce the edited file; please report this")
    return data


FIX_YAML = """id: {id}
summary: "TODO: one line: what goes wrong and what the fix does"
why: |
  TODO: the defect: what goes wrong, for which requests, and how it shows.
evidence: "TODO: function and file in the pinned source where it is shown"
kind: diff
targets:
{targets}
upstream: null
remove_when: "TODO: when upstream has the change (commit or PR)"
tests: [{test}]
releases:
  {release}: {{status: applies}}
"""

TEST_STUB = '''"""{id}: the regression test. It must fail on the tree before the fix and pass after it
(`fixpack check --only {id}`); FIXPACK_TREE is the release tree the check built."""

import pytest


def test_{name}_defect_is_fixed():
    pytest.fail("TODO: show the defect with the real release modules, then assert the fixed behaviour")
'''


def _new_fix_dir(pack: Pack, profile: Profile, port: Port | None, fix_id: str) -> Path:
    return pack.fix_dir(fix_id, port)


def _with_entry(path: Path, key: str, fix_id: str) -> str:
    """The file's text with ``fix_id`` appended to its top-level ``key:`` list, written as the
    list writes its items, every comment and every other key kept."""
    lines = path.read_text().splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    starts = [i for i, line in enumerate(lines) if line.startswith(f"{key}:")]
    if len(starts) != 1:
        raise ConfigError(f"{path}: no single top-level `{key}:` list; add `{fix_id}` to it by hand; nothing was written")
    head = starts[0]
    if lines[head].split("#")[0].strip() == f"{key}: []":
        lines[head] = f"{key}:\n  - {fix_id}\n"
        return "".join(lines)
    end = head + 1  # the block: indented lines and "- " items, up to the next top-level key
    last_item = None
    while end < len(lines) and (not lines[end].strip() or lines[end][0].isspace() or lines[end].startswith(("#", "- "))):
        if lines[end].lstrip().startswith("- "):
            last_item = end
        end += 1
    if last_item is None:
        raise ConfigError(f"{path}: the `{key}` list is not a block list; add `{fix_id}` to it by hand; nothing was written")
    sample = lines[last_item]
    after = last_item + 1  # the last item's own continuation lines (deeper than its dash)
    dash = len(sample) - len(sample.lstrip())
    while after < end and lines[after].strip() and not lines[after].startswith("#") and len(lines[after]) - len(lines[after].lstrip()) > dash:
        after += 1
    entry = f"{sample[:dash]}- id: {fix_id}\n" if sample.lstrip().startswith("- id:") else f"{sample[:dash]}- {fix_id}\n"
    return "".join(lines[:after] + [entry] + lines[after:])


def commit(pack: Pack, fix_id: str) -> dict:
    """Turn the workspace into the fix; returns what was done (files written, the check made)."""
    ws = workspace(pack, fix_id)
    if not ws.dir.is_dir():
        raise ConfigError(f"no edit of {fix_id} in progress ({ws.dir}); start one with `fixpack edit {fix_id}`")
    meta = ws.meta()
    profile = pack.profile(meta["profile"])
    port = pack.port(meta["port"]) if meta.get("port") else None
    place = locate_fix(pack, profile, fix_id, port)
    if [f.id for f in place.before] != meta["before"]:
        raise ConfigError(f"the pack order before {fix_id} changed since `fixpack edit` ({meta['before']} -> {[f.id for f in place.before]}); start again with `fixpack edit {fix_id} --replace`")
    modified, added, removed = tree_changes(ws, profile.packages)
    if added or removed:
        raise ConfigError(f"{ws.tree}: a fix only modifies existing files; " + "; ".join(
            [f"added {r}" for r in added] + [f"removed {r}" for r in removed]) + "; nothing was written")
    if not modified:
        raise ConfigError(f"nothing was changed under {ws.tree}; edit the files there first; nothing was written")
    done: dict = {"fix": fix_id, "changed": sorted(modified), "written": []}
    fix = place.fix
    if fix is not None and not kinds.kind(fix.kind).refreshable:  # a change not written from the tree: checked against it
        done["check"] = check_rewrite(pack, profile, place, ws, modified)
        return done
    data = make_diff(modified)
    if fix is not None:
        if set(fix.target_rels) != set(modified):
            raise ConfigError(f"{fix.dir / 'fix.yaml'}: declares targets {sorted(fix.target_rels)}, the edit changes {sorted(modified)}; "
                              "update `targets` first; nothing was written")
        if _gives(fix.change_file, modified):
            done["check"] = f"{fix.change_file.relative_to(fix.dir)} already gives the edited files: left as it is"
            return done
        fix.change_file.write_bytes(data)
        done["written"].append(str(fix.change_file))
        return done
    d = _new_fix_dir(pack, profile, port, fix_id)
    if d.exists():
        raise ConfigError(f"{d} exists but is not in the pack order; remove it or add it to the profile; nothing was written")
    order = port.dir / "port.yaml" if port is not None else profile.path
    order_text = _with_entry(order, "patches" if port is not None else "fixes", fix_id)
    d.mkdir(parents=True)
    test = f"test_{fix_id.replace('-', '_')}.py"
    targets = "\n".join(f"  - {{package: {rel.split('/', 1)[0]}, path: {rel.split('/', 1)[1]}}}" for rel in sorted(modified))
    (d / "patch.diff").write_bytes(data)
    (d / "fix.yaml").write_text(FIX_YAML.format(id=fix_id, targets=targets, test=test, release=port.profile if port is not None else profile.name))
    (d / test).write_text(TEST_STUB.format(id=fix_id, name=fix_id.replace("-", "_")))
    order.write_text(order_text)
    done["written"] += [str(d / n) for n in ("patch.diff", "fix.yaml", test)] + [str(order)]
    return done


def _gives(patch: Path, modified: dict[str, tuple[bytes, bytes]]) -> bool:
    """Whether the diff there turns every base file into the edited one (its hunk headers and
    context may differ from what make_diff writes; rewriting it would only change its hash)."""
    from fixpack.kinds.diffpatch import apply_file_patch, parse_diff

    try:
        patches = {fp.path: fp for fp in parse_diff(patch.read_bytes(), where=str(patch))}
        return set(patches) == set(modified) and all(apply_file_patch(old, patches[rel], where=str(patch)) == new for rel, (old, new) in modified.items())
    except (OSError, ConfigError, FixFailed):
        return False


def check_rewrite(pack: Pack, profile: Profile, place: Place, ws: Workspace, modified: dict[str, tuple[bytes, bytes]]) -> str:
    """A codemod is code: the author edits it, and the edited tree is what it must produce."""
    assert place.fix is not None
    fix = place.fix
    engine = _engine(pack, profile, place, ws.base, ws.dir / "state-check")
    try:
        out = engine.run_worker(fix, {rel: (ws.base / rel).read_bytes() for rel in fix.target_rels})
    finally:
        engine.close()
        shutil.rmtree(ws.dir / "state-check", ignore_errors=True)
    want = {rel: new for rel, (_, new) in modified.items()}
    diffs: list[str] = []
    for rel in sorted(set(want) | set(out)):
        got = out.get(rel, (ws.base / rel).read_bytes())
        edited = want.get(rel, (ws.base / rel).read_bytes())
        if got != edited:
            diffs += difflib.unified_diff(edited.decode("utf-8", "replace").splitlines(keepends=True), got.decode("utf-8", "replace").splitlines(keepends=True),
                                          f"edited/{rel}", f"{fix.kind}/{rel}", n=2)
    if diffs:
        raise CheckFailed(f"{fix.change_file} does not give the edited tree ({ws.tree}); what it gives instead:\n" + "".join(diffs)[-6000:])
    return f"{fix.change_file.name} gives exactly the edited files ({', '.join(sorted(want))})"
