"""The diff kind of fix: unified diffs applied exactly (no fuzz, no offset).

The file is pinned by hash before a diff touches it, so every hunk must match at the line
it names. A failing hunk is reported by its line range and first differing line, and, to
help whoever refreshes the fix, where else (if anywhere) its old text occurs.
"""

from __future__ import annotations

from dataclasses import dataclass

from fixpack.errors import ConfigError, FixFailed
from fixpack.pack.paths import check_relpath


@dataclass
class Hunk:
    source_start: int  # 1-based, as in the header
    source_length: int
    old: list[bytes]
    new: list[bytes]
    header: str


@dataclass
class FilePatch:
    path: str  # "package/path/in/package.py"
    hunks: list[Hunk]


def _strip_prefix(name: str) -> str:
    name = name.split("\t", 1)[0].strip()
    for prefix in ("a/", "b/"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def parse_diff(data: bytes, *, where: str) -> list[FilePatch]:
    """Parse and vet a unified diff; only modifications of existing text files are allowed."""
    import unidiff

    if not data.strip():
        raise ConfigError(f"{where}: the diff is empty")
    if b"\x00" in data:
        raise ConfigError(f"{where}: the diff contains NUL bytes (binary content is not supported)")
    if b"GIT binary patch" in data or b"\nBinary files " in data or data.startswith(b"Binary files "):
        raise ConfigError(f"{where}: binary diffs are not supported")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: the diff is not UTF-8 ({exc})") from exc
    try:
        patchset = unidiff.PatchSet(split_lines(text))
    except unidiff.UnidiffParseError as exc:
        raise ConfigError(f"{where}: malformed or truncated diff: {exc}") from exc
    if len(patchset) == 0:
        raise ConfigError(f"{where}: no file sections found (is it a unified diff?)")
    out: list[FilePatch] = []
    seen: set[str] = set()
    for pf in patchset:
        src, dst = _strip_prefix(pf.source_file), _strip_prefix(pf.target_file)
        if pf.is_binary_file:
            raise ConfigError(f"{where}: {dst}: binary diffs are not supported")
        if src == "/dev/null":  # not unidiff's is_added_file: a hunk -0,0 may fill an existing empty file
            raise ConfigError(f"{where}: {dst}: the diff creates a file; fixes may only modify existing files")
        if dst == "/dev/null":
            raise ConfigError(f"{where}: {src}: the diff deletes a file; fixes may only modify existing files")
        if src != dst:
            raise ConfigError(f"{where}: renames are not supported ({src} -> {dst})")
        check_relpath(dst, where=f"{where}: file header")
        if dst in seen:
            raise ConfigError(f"{where}: {dst} appears twice in the diff")
        seen.add(dst)
        hunks: list[Hunk] = []
        if len(pf) == 0:
            raise ConfigError(f"{where}: {dst}: file section has no hunks")
        for h in pf:
            old: list[bytes] = []
            new: list[bytes] = []
            lines = list(h)
            for i, line in enumerate(lines):
                if line.line_type == "\\":
                    continue
                value = line.value
                if i + 1 < len(lines) and lines[i + 1].line_type == "\\":
                    value = value[:-1] if value.endswith("\n") else value  # "\ No newline at end of file"
                b = value.encode("utf-8")
                if line.line_type in (" ", "-"):
                    old.append(b)
                if line.line_type in (" ", "+"):
                    new.append(b)
            if len(old) != h.source_length or len(new) != h.target_length:
                raise ConfigError(f"{where}: {dst}: hunk {h.section_header or ''} @@ -{h.source_start} line counts do not match its header (truncated?)")
            hunks.append(Hunk(h.source_start, h.source_length, old, new, f"@@ -{h.source_start},{h.source_length} +{h.target_start},{h.target_length} @@"))
        out.append(FilePatch(dst, hunks))
    return out


def _find_all(lines: list[bytes], block: list[bytes]) -> list[int]:
    n = len(block)
    if n == 0:
        return []
    return [i for i in range(len(lines) - n + 1) if lines[i : i + n] == block]


def split_lines(data):
    """Lines as diff(1) sees them: only '\n' ends a line ('\r', form feed, U+2028... are text)."""
    nl = b"\n" if isinstance(data, bytes) else "\n"
    parts = data.split(nl)
    return [p + nl for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def apply_file_patch(data: bytes, fp: FilePatch, *, where: str) -> bytes:
    lines = split_lines(data)
    out: list[bytes] = []
    cursor = 0  # index into the original lines
    for h in fp.hunks:
        start = h.source_start - 1 if h.source_length else h.source_start
        if start < cursor:
            raise FixFailed(f"{where}: {fp.path}: hunk {h.header} overlaps or precedes the previous hunk")
        actual = lines[start : start + len(h.old)]
        if actual != h.old:
            first = next((k for k in range(len(h.old)) if k >= len(actual) or actual[k] != h.old[k]), 0)
            found = actual[first].decode("utf-8", "replace").rstrip("\r\n") if first < len(actual) else "<end of file>"
            wanted = h.old[first].decode("utf-8", "replace").rstrip("\r\n")
            elsewhere = [i + 1 for i in _find_all(lines, h.old)]
            hint = ""
            if len(elsewhere) == 1:
                hint = f"; its old text occurs at line {elsewhere[0]} instead (refresh the diff)"
            elif len(elsewhere) > 1:
                hint = f"; its old text occurs at {len(elsewhere)} places ({', '.join(map(str, elsewhere[:5]))}): ambiguous"
            raise FixFailed(
                f"{where}: {fp.path}: hunk {h.header} (lines {start + 1}-{start + len(h.old)}) does not match at line "
                f"{start + first + 1}: expected {wanted!r}, found {found!r}{hint}"
            )
        out.extend(lines[cursor:start])
        out.extend(h.new)
        cursor = start + len(h.old)
    out.extend(lines[cursor:])
    return b"".join(out)


def rebase_file_patch(data: bytes, fp: FilePatch) -> tuple[str, bytes | None, list[str]]:
    """Try a diff on a file of another release. Returns (status, new bytes or None, notes):
    "exact", "offset" (each hunk's old text found once elsewhere, in order), "upstream" (every
    hunk's new text present and its old text gone), or "conflict"."""
    try:
        return "exact", apply_file_patch(data, fp, where="rebase"), []
    except FixFailed:
        pass
    lines = split_lines(data)
    positions: list[int] = []
    notes: list[str] = []
    cursor = 0
    ok = True
    for h in fp.hunks:
        found = [i for i in _find_all(lines, h.old) if i >= cursor]
        if len(found) == 1:
            positions.append(found[0])
            cursor = found[0] + len(h.old)
            shift = found[0] + 1 - h.source_start
            notes.append(f"{h.header}: {'+' if shift >= 0 else ''}{shift} lines")
        else:
            ok = False
            notes.append(f"{h.header}: old text found {len(found)} times")
    if ok:
        out: list[bytes] = []
        prev = 0
        for h, pos in zip(fp.hunks, positions, strict=True):
            out.extend(lines[prev:pos])
            out.extend(h.new)
            prev = pos + len(h.old)
        out.extend(lines[prev:])
        return "offset", b"".join(out), notes
    upstream = all(len(_find_all(lines, h.new)) == 1 and not _find_all(lines, h.old) for h in fp.hunks)
    if upstream:
        return "upstream", None, ["every hunk's result is already in the file"]
    conflicts = [n for n in notes if "found" in n]
    return "conflict", None, conflicts


def _diff_lines(data: bytes) -> list[str]:
    # split as diff(1) and parse_diff do (str.splitlines would also split at form feeds and
    # U+2028, giving a diff that does not parse), and mark a last line without a newline
    lines = split_lines(data.decode("utf-8"))
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def unified(old: bytes, new: bytes, rel: str) -> str:
    """A fresh diff between two versions of one file, in the pack's header convention; it
    parses with parse_diff and applies to ``old`` giving ``new``."""
    import difflib

    return "".join(difflib.unified_diff(_diff_lines(old), _diff_lines(new), f"a/{rel}", f"b/{rel}", n=3))
