"""The diff kind: patch.diff, a unified diff applied hunk by hunk at exact lines."""

from __future__ import annotations

from pathlib import Path

from fixpack.kinds.base import Applied, check_declared

CHANGE_FILE = "patch.diff"
IDEMPOTENT = False  # a diff applied twice fails; the engine knows a diff's result by its pin


def apply(fix_dir: Path, sources: dict[str, bytes], drop: int | None = None, known: dict | None = None) -> Applied:
    """``known`` is unused: a diff's hunks carry their own place."""
    from fixpack.diffpatch import FilePatch, apply_file_patch, parse_diff

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
