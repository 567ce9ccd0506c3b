"""The rebase classifier: what happens to each fix on another release.

Each fix, in pack order (defaults and every opt-in), is tried on the other release's
pristine tree, stacked on the fixes before it that still apply. By default its tests also run
there without it (`--no-tests`: the text-only report): every test green means the new release
no longer has the defect, whatever the text says. Classes:
  exact     applies exactly
  offset    applies at an offset: needs a refresh (the refreshed diff is shown)
  conflict  some hunks no longer match (named)
  upstream  already upstream: retire it. Its tests pass on the new release without it, or
            the new release has the fixed text (an edit or codemod changes nothing, a diff's new side
            is there)
  duplicate its change would apply, but the lines it adds are already in the target: upstream
            fixed it in its own place, and applying it would add them twice
  moved     a target file moved or was removed
  nomatch   an edit's definition or a codemod's place is found 0 times
A test run is reported beside the class: green (retire), red (the defect is still there:
carry the fix), or "cannot run" (the new release breaks the test itself; the class is then
from the text alone).
The command is fixpack/cli/commands/rebase_report.py.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from fixpack import kinds
from fixpack.errors import ConfigError


def new_sources(profile, onto: list[str]) -> dict:
    from fixpack.sources import sources

    srcs = copy.deepcopy(profile.base["sources"])
    if not onto:
        raise ConfigError("give at least one --onto PACKAGE=REF")
    for item in onto:
        if "=" not in item:
            raise ConfigError(f"--onto {item!r}: expected PACKAGE=REF")
        pkg, ref = item.split("=", 1)
        if pkg not in srcs:
            raise ConfigError(f"--onto {item!r}: {pkg} is not a source of the profile ({', '.join(srcs)})")
        spec = srcs[pkg]
        if spec["kind"] == "wheel":
            spec["version"] = ref
            spec.pop("commit", None)
        else:
            spec["commit"] = sources.rev_parse(spec["repo"], ref) if len(ref) != 40 else ref
            spec["tag"] = ref
    return srcs


def classify(fix, tree: Path, found: dict) -> tuple[str, dict[str, bytes], list[str], str]:
    """(class, new file contents, notes, refreshed diff)."""
    for t in fix.targets:
        if not (tree / t.rel).is_file():
            return "moved", {}, [f"{t.rel} is not in the new release"], ""
    return kinds.kind(fix.kind).rebase(fix, tree)


def added_lines(fix, tree: Path) -> dict[str, list[str]]:
    """The significant lines the fix adds, by target: a diff's '+' lines, an edit's or a
    codemod's new text beyond its old text."""
    return kinds.kind(fix.kind).added_lines(fix, tree)


def duplicates(fix, tree: Path) -> list[str]:
    """Targets in which every significant line the fix adds is already present."""
    found = []
    for rel, lines in added_lines(fix, tree).items():
        path = tree / rel
        if not lines or not path.is_file():
            continue
        have = {line.strip() for line in path.read_text(errors="replace").splitlines()}
        if all(line in have for line in lines):
            found.append(f"{rel}: all {len(lines)} line(s) it adds are already there (e.g. {lines[0][:70]!r})")
    return found


def test_verdict(fix, tree: Path, timeout: float) -> tuple[str, str]:
    """('green' | 'red' | 'cannot run', one line) for the fix's tests on ``tree``."""
    from fixpack.proofs import proof

    run = proof.run_tests(fix, tree, timeout)
    if not run.reported:
        return "cannot run", run.summary
    if run.collect_errors:
        return "cannot run", f"collection: {run.collect_errors[0]['cause']}"
    guards = list(fix.meta.get("regression_guards") or [])
    reds: list[str] = []
    broken: list[str] = []
    n = 0
    for nodeid, rec in run.tests.items():
        if any(proof.guard_matches(g, nodeid, rec["name"]) for g in guards):
            continue  # a guard passes with or without the fix: it says nothing here
        n += 1
        fail = proof._failure(rec)
        if fail is None:
            continue
        ok, cause = proof.red_of(rec)
        (reds if ok else broken).append(f"{nodeid.split('::', 1)[-1]}: {cause}")
    if broken:
        return "cannot run", broken[0]
    if reds:
        return "red", f"{len(reds)} of {n} test(s) red: {reds[0]}"
    return "green", f"all {n} test(s) pass without the fix"


LABELS = {
    "exact": "applies exactly",
    "offset": "applies at an offset (refresh)",
    "conflict": "CONFLICTS",
    "upstream": "already upstream: retire",
    "duplicate": "DUPLICATE: upstream has its lines",
    "moved": "target moved/removed",
    "nomatch": "definition/place found 0 times",
}


def rebase_report(pack, profile, srcs: dict, *, only: list[str] | None = None, tests: bool = True, test_timeout: float = 900.0) -> list[dict]:
    """One row per fix of ``profile`` (defaults and every opt-in; with ``only``, those named),
    each tried on the release ``srcs`` gives, stacked on the fixes before it that still apply."""
    from fixpack.apply.store import atomic_write
    from fixpack.sources import release, sources

    fixes = pack.selection(profile, profile.opt_ins)
    if only is not None:
        unknown = sorted(set(only) - {f.id for f in fixes})
        if unknown:
            raise ConfigError(f"--only: {', '.join(unknown)} not in profile {profile.name}")
    rows = []
    with release.scratch("fixpack-rebase-") as work:
        tree = sources.materialise(srcs, work / "tree")
        found = {p: tree / p for p in profile.packages}
        for fix in fixes:
            wanted = only is None or fix.id in only
            verdict = None
            if wanted and tests:
                verdict = test_verdict(fix, tree, test_timeout)
            cls, changes, notes, refreshed = classify(fix, tree, found)
            if cls in ("exact", "offset"):
                dup = duplicates(fix, tree)
                if dup:
                    cls, notes = "duplicate", notes + dup
            if verdict is not None:
                notes.append(f"tests without the fix: {verdict[0]} ({verdict[1]})")
                if verdict[0] == "green" and cls != "moved":
                    cls = "upstream"
            new_change = None
            if cls == "offset":  # a kind located by line (a diff) whose lines moved:
                # the whole change made against the new release's bytes (every file, not only the moved ones)
                from fixpack.kinds.diffpatch import unified

                new_change = "".join(unified((tree / t.rel).read_bytes(), changes[t.rel], t.rel) for t in fix.targets if t.rel in changes)
            for rel, data in changes.items():
                if cls in ("exact", "offset"):
                    atomic_write(tree / rel, data, like=os.stat(tree / rel))  # the next fixes stack on it
            if wanted:
                rows.append({"fix": fix.id, "class": cls, "tests": verdict[0] if verdict else None, "notes": notes, "refreshed_diff": refreshed, "new_change": new_change})
    return rows


# ---- writing a new release's entry into fix.yaml


def release_entry(fix, row: dict, release: str) -> tuple[dict | None, bytes | None, str]:
    """(the fix.yaml entry for ``release``, the bytes of its own change file or None, what was
    decided) from one report row; the entry is None where a person must decide (a conflict)."""
    cls = row["class"]
    said = "; ".join(row["notes"][:5])
    shared = fix.change_dir == fix.dir  # the release the report started from applies the shared change
    if cls == "exact":
        if shared:
            return {"status": "applies"}, None, "applies: the shared change applies exactly"
        why = f"the change of {fix.release} applies exactly on {release}"
        return {"status": "refreshed", "why": why}, fix.change_file.read_bytes(), f"refreshed: {why}"
    if cls == "offset" and row.get("new_change"):
        why = f"re-made by fixpack rebase-report: the change of {fix.release} applies at an offset on {release} ({said[:300]})"
        return {"status": "refreshed", "why": why}, row["new_change"].encode(), "refreshed: the diff re-made at the new offsets"
    if cls in ("upstream", "duplicate"):
        evidence = f"fixpack rebase-report ({LABELS[cls]}): {said}" if said else f"fixpack rebase-report: {LABELS[cls]}"
        return {"status": "upstream", "evidence": evidence}, None, "upstream: " + LABELS[cls]
    return None, None, f"not written: {LABELS[cls]}; make its change with `fixpack edit {fix.id} --profile {release}` once the profile exists"


def _entry_text(release: str, entry: dict) -> str:
    import yaml

    body = yaml.safe_dump({release: entry}, sort_keys=False, width=100, default_flow_style=False)
    return "".join(f"  {line}\n" for line in body.splitlines())


def write_release_entry(fix, release: str, entry: dict, change: bytes | None) -> list[Path]:
    """Add ``release``'s entry to the fix's fix.yaml ``releases:`` (and its own change file),
    keeping the rest of the file byte for byte; the result is validated, else nothing is left
    written. Returns the files written."""
    from fixpack.apply.store import atomic_write
    from fixpack.pack.pack import load_fix

    path = fix.dir / "fix.yaml"
    text = path.read_text()
    if release in fix.meta["releases"]:
        raise ConfigError(f"{path}: releases already has an entry {release!r}; left as it is")
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip() == "releases:"]
    if len(starts) != 1:
        raise ConfigError(f"{path}: no top-level `releases:` block to add {release!r} to")
    end = starts[0] + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][:1] in (" ", "#")):
        end += 1
    while end > starts[0] + 1 and not lines[end - 1].strip():
        end -= 1
    if end > 0 and not lines[end - 1].endswith("\n"):
        lines[end - 1] += "\n"
    new_text = "".join(lines[:end]) + _entry_text(release, entry) + "".join(lines[end:])
    own = fix.dir / release / fix.change_file.name if change is not None else None
    written = []
    try:
        if own is not None:
            own.parent.mkdir(exist_ok=True)
            own.write_bytes(change)
            written.append(own)
        atomic_write(path, new_text.encode(), like=os.stat(path))
        written.append(path)
        load_fix(fix.dir, layer=fix.layer)  # the file as a whole still validates
    except Exception:
        atomic_write(path, text.encode(), like=os.stat(path))
        if own is not None:
            own.unlink(missing_ok=True)
            if own.parent.is_dir() and not any(own.parent.iterdir()):
                own.parent.rmdir()
        raise
    return written
