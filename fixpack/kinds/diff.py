"""The diff kind: patch.diff, a unified diff applied hunk by hunk at exact lines."""

from __future__ import annotations

from pathlib import Path

from fixpack.kinds import DIFF
from fixpack.kinds.base import Applied, Rebased, check_declared, significant

CHANGE_FILE = DIFF.change_file


def apply(fix_dir: Path, sources: dict[str, bytes], drop: int | None = None, known: dict | None = None) -> Applied:
    """``known`` is unused: a diff's hunks carry their own place."""
    from fixpack.kinds.diffpatch import FilePatch, apply_file_patch, parse_diff

    patch_file = fix_dir / CHANGE_FILE
    patches = parse_diff(patch_file.read_bytes(), where=str(patch_file))
    check_declared(str(patch_file), {fp.path for fp in patches}, set(sources), "changes")
    outputs, parts = dict(sources), list[str]()
    for fp in patches:
        hunks = []
        for h in fp.hunks:
            if len(parts) != drop:
                hunks.append(h)
            parts.append(f"{fp.path} {h.header}")
        outputs[fp.path] = apply_file_patch(sources[fp.path], FilePatch(fp.path, hunks), where=str(patch_file))
    return Applied(outputs, parts)


def rebase(fix, tree: Path) -> Rebased:
    """Each hunk where its lines are (exact), moved (offset: the diff re-made against the new
    release's bytes), no longer found (conflict) or already there (upstream)."""
    from fixpack.kinds.diffpatch import parse_diff, rebase_file_patch, unified

    changes: dict[str, bytes] = {}
    notes: list[str] = []
    classes = []
    refreshed = []
    for fp in parse_diff(fix.change_file.read_bytes(), where=str(fix.change_file)):
        data = (tree / fp.path).read_bytes()
        status, new, n = rebase_file_patch(data, fp)
        classes.append(status)
        notes += [f"{fp.path}: {x}" for x in n]
        if new is not None:
            changes[fp.path] = new
            if status == "offset":
                refreshed.append(unified(data, new, fp.path))
    for cls in ("conflict", "upstream", "offset"):
        if cls in classes:
            if cls == "upstream" and len(set(classes)) > 1:
                return "conflict", {}, notes, ""
            return cls, (changes if cls == "offset" else {}), notes, "".join(refreshed)
    return "exact", changes, notes, ""


def added_lines(fix, tree: Path) -> dict[str, list[str]]:
    """The diff's significant '+' lines that its hunk does not also remove."""
    from fixpack.kinds.diffpatch import parse_diff

    out: dict[str, list[str]] = {}
    for fp in parse_diff(fix.change_file.read_bytes(), where=str(fix.change_file)):
        for h in fp.hunks:
            removed = {raw.decode("utf-8", "replace").strip() for raw in h.old}
            for raw in h.new:
                t = significant(raw.decode("utf-8", "replace"))
                if t and t not in removed:
                    out.setdefault(fp.path, []).append(t)
    return out


def validate(fix) -> None:
    from fixpack.errors import ConfigError
    from fixpack.kinds.diffpatch import parse_diff

    patches = parse_diff(fix.change_file.read_bytes(), where=str(fix.change_file))
    declared = set(fix.target_rels)
    changed = {p.path for p in patches}
    if changed != declared:
        raise ConfigError(f"{fix.change_file}: changes {sorted(changed)} but fix.yaml declares {sorted(declared)}")
