"""The journal: a fix's files are committed all-or-nothing, and a crash is finished next run.

A commit stores both sides of every file as backups, writes journal.json (the step, each
file's hash before and after, the state record to write), renames each new file into place,
writes the state record and removes the journal. A run that finds a journal finishes the
commit it records (`recover`); a commit that fails part-way puts back what it renamed
(`roll_back`), or leaves the journal for the next run when it cannot.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from fixpack.apply.hashing import short
from fixpack.apply.state import Journal, StateRecord, Step, Unreadable
from fixpack.apply.store import Store, crashpoint, drop_bytecode, replace_in_tree
from fixpack.cli.output import Lines
from fixpack.errors import Drift


class Files(Protocol):
    """The target files of a run, by package-relative path."""

    def path(self, rel: str) -> Path: ...

    def root(self, rel: str) -> Path: ...

    def current(self, rels) -> dict[str, str | None]: ...


def commit(
    store: Store,
    files_of: Files,
    op: str,
    step: Step,
    changes: dict[str, tuple[bytes, bytes]],
    steps_before: list[Step],
    base: StateRecord,
    report: Lines,
) -> list[Step]:
    """Write a fix's files all-or-nothing: backups, journal, renames, state, journal gone.
    Returns the steps now applied."""
    # both sides stored as backups; put gives each one's sha256
    files = {rel: [store.put(old), store.put(new)] for rel, (old, new) in changes.items()}
    store.write_journal(Journal(op=op, step=step, files=files, state_base=base, steps_before=list(steps_before)))
    crashpoint(f"journal written for {op} {step.fix}")
    done: list[str] = []
    try:
        for rel, (_old, new) in changes.items():
            p = files_of.path(rel)
            # The target may have been swapped (directory, symlink, other bytes) since it was read.
            if files_of.current([rel])[rel] != files[rel][0]:
                raise Drift(f"{rel}: changed while {step.fix} was being committed; nothing of this fix was kept")
            # through descriptors walked from the package folder: a folder swapped is refused (exit 6)
            replace_in_tree(files_of.root(rel), p, new, label=rel)
            done.append(rel)
            drop_bytecode(p, files_of.root(rel))
        steps = after_op(op, step, steps_before)
        store.write_state(base.with_steps(steps))
    except Exception:
        roll_back(store, files_of, done, changes, files, report)
        raise
    crashpoint(f"state written for {op} {step.fix}")
    store.clear_journal()
    return steps


def after_op(op: str, step: Step, steps: list[Step]) -> list[Step]:
    """The applied steps once ``op`` (apply or unwind) of ``step`` is done. `revert FIX` may
    undo a step in the middle, not only the last one."""
    if op == "apply":
        return [*steps, step]
    return [s for s in steps if s.fix != step.fix]


def roll_back(
    store: Store,
    files_of: Files,
    done: list[str],
    changes: dict[str, tuple[bytes, bytes]],
    files: dict[str, list[str]],
    report: Lines,
) -> None:
    """A commit failed part-way (full disk, read-only, a swapped target): put back the files
    already renamed and drop the journal. If that fails too, the journal stays and the next
    run finishes the fix instead."""
    try:
        for rel in done:
            p = files_of.path(rel)
            if files_of.current([rel])[rel] == files[rel][1]:
                replace_in_tree(files_of.root(rel), p, changes[rel][0], label=f"{rel} (roll back)")
                drop_bytecode(p, files_of.root(rel))
        store.clear_journal()
    except Exception as exc:  # keep the first error; the journal tells the next run what to do
        report.say(
            f"warning: could not roll back ({exc}); the next run completes the interrupted fix from {store.journal_path}"
        )


def recover(store: Store, files_of: Files, report: Lines, check: Callable[[Journal], None] | None = None) -> None:
    """Finish the commit an interrupted run left in the journal, if any. ``check`` (the engine's,
    against the lock) raises Drift for a journal whose states the lock does not pin: it is
    never finished, so no byte it names is written."""
    journal = store.read_journal()
    if journal is None:
        return
    if isinstance(journal, Unreadable):
        raise Drift(f"{store.journal_path} is unreadable; inspect the files with `fixpack verify`, then remove it")
    if check is not None:
        check(journal)
    report.say(f"recovering an interrupted run: {journal.op} {journal.step.fix}")
    cur = files_of.current(journal.files)
    for rel, (src, dst) in journal.files.items():
        if cur[rel] == dst:
            drop_bytecode(files_of.path(rel), files_of.root(rel))  # the kill may have come between the rename and this
            continue
        if cur[rel] != src:
            raise Drift(f"{rel}: interrupted run left {short(cur[rel])}, neither {short(src)} nor {short(dst)}")
        p = files_of.path(rel)
        replace_in_tree(files_of.root(rel), p, store.get(dst), label=rel)
        drop_bytecode(p, files_of.root(rel))
    state = store.read_state()
    if not isinstance(state, StateRecord):
        state = journal.state_base.with_steps(journal.steps_before)
    steps = state.steps
    if journal.op == "apply" and (not steps or steps[-1].fix != journal.step.fix):
        steps = [*steps, journal.step]
    if journal.op == "unwind":
        steps = [s for s in steps if s.fix != journal.step.fix]
    store.write_state(state.with_steps(steps))
    store.clear_journal()
