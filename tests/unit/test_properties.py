"""Property-based tests (hypothesis) of the engine on random files and random fixes.

For random file contents (any UTF-8 text, LF or CRLF, with or without a final newline,
form feeds and other characters Python's str.splitlines would break on) and random diff fixes
(one or two per file, a later one built on the earlier one's output):

- apply then revert --all gives back the exact bytes and modes;
- applying twice equals applying once (the second run writes nothing);
- verify detects every single-byte change (substitution, and a sample of insertions and
  deletions) of every fixed file.

The engine runs in this process with each fix computed by fixpack.sandbox.worker.run in-process (the
same code the worker process runs), so hundreds of examples stay cheap; the CLI path, the
worker process and its guard are covered by the other reliability tests.
"""

from __future__ import annotations

import difflib
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixpack.apply.engine import Engine, revert
from fixpack.apply.store import Store
from fixpack.apply.verify import verify
from fixpack.cli.output import Lines
from fixpack.errors import FixFailed
from fixpack.pack.lockfile import Lock
from fixpack.pack.pack import Pack
from fixpack.sandbox import worker
from packtests.builders import fix_yaml, write_lock, write_tree

FILES = ["pkg_a/r0.txt", "pkg_b/r1.txt"]

# Characters that end a line for str.splitlines but not for a diff: a fix must treat them as text.
ODD = ["\x0c", "\x0b", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r", "\t", "é", "€", "𝔘"]
line_text = st.text(
    alphabet=st.one_of(st.characters(min_codepoint=32, max_codepoint=126), st.sampled_from(ODD)), max_size=12
).map(lambda s: s.replace("\r", "\r "))
file_spec = st.tuples(st.lists(line_text, min_size=1, max_size=25), st.sampled_from(["\n", "\r\n"]), st.booleans())
edit = st.tuples(
    st.integers(min_value=0, max_value=10_000), st.sampled_from(["replace", "insert", "delete"]), line_text
)


def render(lines: list[str], eol: str, final_newline: bool) -> bytes:
    text = eol.join(lines) + (eol if final_newline else "")
    return text.encode("utf-8")


def split_keep(data: bytes) -> list[bytes]:
    """Lines as a diff sees them: only '\\n' ends a line."""
    parts = data.split(b"\n")
    out = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def apply_edits(data: bytes, edits, eol: str) -> bytes:
    lines = split_keep(data)
    for pos, kind, text in edits:
        new_line = (text + "~").encode() + eol.encode()  # never equal to an existing line by accident
        if kind == "insert" or not lines:
            lines.insert(pos % (len(lines) + 1), new_line)
        elif kind == "replace":
            i = pos % len(lines)
            keep_eol = lines[i].endswith(b"\n")
            lines[i] = new_line if keep_eol else new_line.rstrip(b"\r\n")
        elif len(lines) > 1:
            del lines[pos % len(lines)]
    out = b"".join(lines)
    return out if out != data else data + b"changed" + eol.encode()


def make_diff(rel: str, old: bytes, new: bytes) -> bytes:
    a = [part.decode() for part in split_keep(old)]
    b = [part.decode() for part in split_keep(new)]
    out = []
    for i, line in enumerate(difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}", lineterm="\n")):
        # the two file headers come first; later a removed "--" or added "++" line starts alike
        if i < 2:
            out.append(line if line.endswith("\n") else line + "\n")
        elif line.startswith("@@"):
            out.append(line)
        elif not line.endswith("\n"):
            out.append(line + "\n\\ No newline at end of file\n")
        else:
            out.append(line)
    return "".join(out).encode()


def inprocess_worker(self, fix, inputs, pins=None, hashes=None):
    stage = Path(tempfile.mkdtemp(prefix="fixpack-prop-stage-"))
    for i, data in enumerate(inputs.values()):  # the bytes the driver read and hashed
        (stage / f"{i}.in").write_bytes(data)
    job = {
        "fix_dir": str(fix.dir),
        "kind": fix.kind,
        "stage_dir": str(stage),
        "check_idempotent": self.check_idempotent,
        "targets": [
            {"rel": rel, "src": str(stage / f"{i}.in"), "out": str(stage / f"{i}.out")} for i, rel in enumerate(inputs)
        ],
    }
    try:
        worker.run(job)
        return {t["rel"]: Path(t["out"]).read_bytes() for t in job["targets"]}
    except Exception as exc:
        raise FixFailed(f"{fix.id}: {type(exc).__name__}: {exc}") from exc
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextmanager
def random_pack(files, fixes_per_file, data):
    """A pack whose profile holds random diff fixes of random files; yields (engine factory, tree, pristine, final)."""
    with (
        tempfile.TemporaryDirectory(prefix="fixpack-prop-") as d,
        mock.patch.object(Engine, "run_worker", inprocess_worker),
    ):
        root = Path(d) / "pack"
        src = write_tree(root / "pristine")
        pristine, final, entries = {}, {}, []
        for rel, (lines, eol, nl) in zip(FILES, files, strict=False):
            content = render(lines, eol, nl)
            (src / rel).write_bytes(content)
            os.chmod(src / rel, data.draw(st.sampled_from([0o644, 0o600, 0o755, 0o640])))
            pristine[rel] = content
            cur = content
            for k in range(fixes_per_file):
                new = apply_edits(cur, data.draw(st.lists(edit, min_size=1, max_size=4)), eol)
                fid = f"p{FILES.index(rel)}-{k}"
                fd = root / "fixes" / fid
                fd.mkdir(parents=True)
                (fd / "fix.yaml").write_text(fix_yaml(fid, "diff", [rel]))
                (fd / "patch.diff").write_bytes(make_diff(rel, cur, new))
                (fd / "test_it.py").write_text("def test_x():\n    pass\n")
                entries.append({"id": fid})
                cur = new
            final[rel] = cur
        (root / "profiles").mkdir()
        (root / "profiles" / "test.yaml").write_text(
            yaml.safe_dump({"name": "test", "base": {"sources": {}}, "packages": ["pkg_a", "pkg_b"], "fixes": entries})
        )
        write_lock(root)
        tree = Path(d) / "tree"
        shutil.copytree(src, tree)
        pack = Pack(root)
        profile = pack.profile("test")

        def engine():
            found = {p: tree / p for p in profile.packages}
            return Engine(
                pack,
                profile,
                None,
                [],
                found,
                Store(tree / ".fixpack"),
                Lock.load(profile.lock_path),
                report=Lines(quiet=True),
            )

        yield engine, tree, pristine, final


SETTINGS = settings(
    max_examples=int(os.environ.get("FIXPACK_PROP_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
files_st = st.lists(file_spec, min_size=2, max_size=2)


def modes(tree):
    return {rel: stat.S_IMODE(os.stat(tree / rel).st_mode) for rel in FILES}


@SETTINGS
@given(files=files_st, n=st.integers(min_value=1, max_value=2), data=st.data())
def test_apply_then_revert_gives_back_the_exact_bytes(files, n, data):
    with random_pack(files, n, data) as (engine, tree, pristine, final):
        before = modes(tree)
        assert engine().apply() == 0
        for rel in FILES:
            assert (tree / rel).read_bytes() == final[rel]
        assert modes(tree) == before
        assert revert(engine(), None) == 0
        for rel in FILES:
            assert (tree / rel).read_bytes() == pristine[rel]
        assert modes(tree) == before


@SETTINGS
@given(files=files_st, n=st.integers(min_value=1, max_value=2), data=st.data())
def test_apply_twice_equals_apply_once(files, n, data):
    with random_pack(files, n, data) as (engine, tree, pristine, final):
        assert engine().apply() == 0
        once = {
            rel: ((tree / rel).read_bytes(), os.stat(tree / rel).st_ino, os.stat(tree / rel).st_mtime_ns)
            for rel in FILES
        }
        state = (tree / ".fixpack" / "state.json").read_bytes()
        assert engine().apply() == 0
        assert {
            rel: ((tree / rel).read_bytes(), os.stat(tree / rel).st_ino, os.stat(tree / rel).st_mtime_ns)
            for rel in FILES
        } == once
        assert (tree / ".fixpack" / "state.json").read_bytes() == state


@SETTINGS
@given(files=files_st, data=st.data())
def test_verify_detects_every_single_byte_change(files, data):
    with random_pack(files, 1, data) as (engine, tree, pristine, final):
        e = engine()
        assert e.apply() == 0
        found, store, lock = e.found, e.store, e.lock
        assert verify(found, store, lock, Lines(quiet=True))[0] == 0
        for rel in FILES:
            p = tree / rel
            good = p.read_bytes()
            variants = []
            for i in range(len(good)):
                variants.append(
                    good[:i] + bytes([(good[i] + data.draw(st.integers(1, 255), label="delta")) % 256]) + good[i + 1 :]
                )
            for i in data.draw(st.lists(st.integers(0, len(good)), max_size=5), label="insertions"):
                variants.append(good[:i] + b"x" + good[i:])
            for i in data.draw(st.lists(st.integers(0, max(0, len(good) - 1)), max_size=5), label="deletions"):
                variants.append(good[:i] + good[i + 1 :])
            for bad in variants:
                p.write_bytes(bad)
                rc, result = verify(found, store, lock, Lines(quiet=True))
                assert rc == 5 and result["files"][rel]["status"] == "drifted"
            p.write_bytes(good)
        assert verify(found, store, lock, Lines(quiet=True))[0] == 0
