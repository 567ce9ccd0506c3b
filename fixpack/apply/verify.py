"""fixpack verify's core: what the image holds, from the state record and the files.

Imports only the standard library and fixpack's small modules (no YAML, no engine), so it
can run at every container start.
"""

from __future__ import annotations

from pathlib import Path

from fixpack.apply import dirfd
from fixpack.apply.hashing import sha256_bytes, short
from fixpack.apply.state import Unreadable, selection_pins, unpinned
from fixpack.apply.store import Store
from fixpack.cli.output import Lines, printable
from fixpack.pack.lockfile import Lock


def _hash(found: dict[str, Path], rel: str) -> str | None:
    """The sha256 of target ``rel`` as the engine reads it (fixpack.apply.dirfd.read_under: through
    its folder's descriptor, no symlink followed, never blocking, bounded); None when it is
    missing or is not a regular file that can be read."""
    package, sub = rel.split("/", 1)
    if package not in found:
        return None
    try:
        return sha256_bytes(dirfd.read_under(str(found[package]), str(found[package] / sub)))
    except (OSError, dirfd.NotRegular, dirfd.ParentReplaced):
        return None


def verify(found: dict[str, Path], store: Store, lock: Lock | None, report: Lines) -> tuple[int, dict]:
    """What the image holds, from the state record and the files themselves."""
    state = store.read_state()
    result: dict = {"state": str(store.state_path), "fixes": [], "files": {}, "drift": False}
    if store.has_journal():
        # a run was killed or failed mid-commit and could not roll back: the files may be between two states
        report.say(f"interrupted: {store.journal_path} records a fix being committed; the next `fixpack apply` or `fixpack revert` finishes it")
        result["interrupted"] = True
        result["drift"] = True
    if state is None or isinstance(state, Unreadable):
        result["applied"] = None
        report.say("no state record: nothing applied by fixpack" if state is None else f"state record {store.state_path} is corrupt")
        if state is not None:
            result["drift"] = True
            return 5, result
        if lock:
            for rel, h in sorted(lock.pristine.items()):
                if rel.split("/", 1)[0] in found:
                    now = _hash(found, rel)
                    status = "untouched" if now == h else "drifted"
                    result["files"][rel] = {"status": status, "found": now, "expected": h}
                    if status != "untouched":
                        result["drift"] = True
                        report.line(rel, status, f"found {short(now)}, pristine is {short(h)}")
        return (5 if result["drift"] else 0), result
    result["applied"] = {k: getattr(state, k) for k in ("profile", "port", "opt_in", "key", "tool_version", "updated")}
    # the state record and the packages' version files are not trusted: what they say is escaped
    report.say(printable(f"profile {state.profile}  selection {state.key}  by fixpack {state.tool_version} at {state.updated}"))
    found_ids = (state.base or {}).get("found") or {}
    for pkg, info in found_ids.items():
        report.say(printable(f"  {pkg}: " + ", ".join(f"{k}={v}" for k, v in info.items())))
    result["base"] = found_ids
    # which walls stood around the fix processes that made this state (older records lack it)
    result["protection"] = state.protection
    prot = state.protection or {}
    if prot:
        kernel = f"Landlock ABI {prot.get('abi')}" + (" and seccomp (kernel)" if prot.get("seccomp") else " (kernel)") if prot.get("sandbox") == "landlock" else f"no Landlock ({prot.get('reason')})"
        dropped = ", no capabilities" if prot.get("capabilities") == "none" else ""
        report.say(printable(f"  fix processes confined by: {kernel}{dropped}, audit hook, {prot.get('detection', 'snapshot')} check"))
    final: dict[str, str] = {}
    for s in state.steps:
        final.update(s.after())
    cur: dict[str, str | None] = {rel: _hash(found, rel) for rel in final}
    # a step counts as applied only when the lock pins it for the record's selection: a record
    # the lock does not pin is drift, whatever the files hold (they may hold what it claims)
    pins = selection_pins(lock, state.key) if lock else None
    for s in state.steps:
        why = unpinned(lock, state.key, pins, s) if lock else None
        ok = why is None and all(cur[rel] == final[rel] for rel in s.files)
        status = "applied" if ok else "drifted"
        if why:
            detail = f"{store.state_path}: {why}"
        else:
            detail = ", ".join(f"{rel}: {short(cur[rel])}" for rel in s.files) if not ok else f"{len(s.files)} file(s)"
        report.line(printable(s.fix), status, printable(detail))
        result["fixes"].append({"fix": s.fix, "status": status, "files": list(s.files), "sandbox": s.sandbox, **({"unpinned": why} if why else {})})
        result["drift"] |= not ok
    bad = {rel for st in state.steps if lock and unpinned(lock, state.key, pins, st) for rel in st.files}
    for rel in final:
        result["files"][rel] = {"status": "fixed" if cur[rel] == final[rel] and rel not in bad else "drifted", "found": cur[rel], "expected": final[rel]}
    if lock:
        for rel, h in sorted(lock.pristine.items()):
            if rel in final:
                continue
            if rel.split("/", 1)[0] not in found:
                continue
            c = _hash(found, rel)
            status = "untouched" if c == h else "drifted"
            result["files"][rel] = {"status": status, "found": c, "expected": h}
            if status == "drifted":
                result["drift"] = True
                report.line(rel, "drifted", f"found {short(c)}, pristine is {short(h)}")
    return (5 if result["drift"] else 0), result


