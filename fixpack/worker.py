"""Applies one fix in its own process: a child of fixpack.forkserver, or
``python -m fixpack.worker`` with a JSON job on stdin.

The job names the fix folder, its kind, and for each declared target the file to read and
the staging file to write. The worker never writes anywhere else: an audit hook refuses any
other write, so a codemod that tries to touch an undeclared file fails alone. The driver
checks the staged bytes against the pins and commits them; nothing here touches a target.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path


def _guard_writes(allowed_dir: str) -> None:
    allowed = os.path.realpath(allowed_dir) + os.sep
    write_events = {"os.remove", "os.unlink", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.truncate", "shutil.rmtree", "os.chmod", "os.chown", "os.symlink", "os.link"}

    two_path_events = {"os.rename", "os.replace", "os.symlink", "os.link"}
    spawn_events = {"os.system", "subprocess.Popen", "os.fork", "os.forkpty", "pty.spawn"}

    def hook(event, args):
        path = None
        if event == "open":
            path, mode = args[0], args[1]
            if isinstance(mode, str):
                writing = any(c in mode for c in "wax+")
            else:
                writing = isinstance(args[2], int) and bool(args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if not writing or isinstance(path, int):
                return
        elif event in write_events:
            path = args[0]
            if event in two_path_events:  # (src, dst, ...): the destination is where it writes
                check(args[1])
                if event in ("os.symlink", "os.link"):
                    return  # the source of a link is only read (os.symlink's need not even exist)
        elif event in spawn_events or event.startswith(("os.exec", "os.spawn", "os.posix_spawn")):
            raise PermissionError(f"fix tried to start a process ({event}); a fix computes its targets' new text and nothing else")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            raise PermissionError(f"fix tried to send a signal ({event}); a fix computes its targets' new text and nothing else")
        else:
            return
        check(path)

    def check(path):
        if isinstance(path, int) or path is None:
            return
        real = os.path.realpath(os.fsdecode(path))
        if not (real + os.sep).startswith(allowed) and not real.startswith(allowed):
            raise PermissionError(f"fix tried to write {real}, outside its staging area (fixes may only change their declared targets)")

    sys.addaudithook(hook)


def run(job: dict) -> dict:
    fix_dir = Path(job["fix_dir"])
    outputs: dict[str, str] = {}
    anchors: dict[str, dict] = {}
    if job["kind"] == "diff":
        from fixpack.diffpatch import apply_file_patch, parse_diff

        patch_file = fix_dir / "patch.diff"
        patches = parse_diff(patch_file.read_bytes(), where=str(patch_file))
        declared = {t["rel"] for t in job["targets"]}
        for fp in patches:
            if fp.path not in declared:
                raise PermissionError(f"{patch_file}: changes {fp.path}, which fix.yaml does not declare as a target")
        by_rel = {fp.path: fp for fp in patches}
        for t in job["targets"]:
            fp = by_rel.get(t["rel"])
            if fp is None:
                raise ValueError(f"{patch_file}: declares target {t['rel']} but the diff does not change it")
            data = Path(t["src"]).read_bytes()
            new = apply_file_patch(data, fp, where=str(patch_file))
            Path(t["out"]).write_bytes(new)
            outputs[t["rel"]] = t["out"]
    else:
        from fixpack.codemod import apply_rewrites, load_rewrites

        codemod_file = fix_dir / "codemod.py"
        rewrites = load_rewrites(codemod_file)
        declared = {t["rel"] for t in job["targets"]}
        for cls in rewrites:
            if cls.target not in declared:
                raise PermissionError(f"{codemod_file}: {cls.__name__} targets {cls.target!r}, which fix.yaml does not declare")
        for t in job["targets"]:
            source = Path(t["src"]).read_bytes().decode("utf-8")
            pin = (job.get("expect") or {}).get(t["rel"])
            result = apply_rewrites(rewrites, t["rel"], source, t.get("anchors"), as_text=bool(pin))
            if pin and hashlib.sha256(result.text.encode("utf-8")).hexdigest() != pin:
                # the text-only form differs from the pin: libcst decides (and the driver checks)
                result = apply_rewrites(rewrites, t["rel"], source, t.get("anchors"))
            if result.anchors:
                anchors[t["rel"]] = result.anchors
            if not result.rewritten:
                raise ValueError(f"{codemod_file}: no rewrite targets {t['rel']}")
            new = result.text.encode("utf-8")
            if job.get("check_idempotent"):
                again = apply_rewrites(rewrites, t["rel"], result.text).text.encode("utf-8")
                if again != new:
                    raise ValueError(f"{codemod_file}: not idempotent on {t['rel']}: a second run changes its own output")
            Path(t["out"]).write_bytes(new)
            outputs[t["rel"]] = t["out"]
    # Every output must at least be valid Python that compiles, unless it is byte for byte the
    # pinned result (the lock compiled that one when it recorded the pin; the driver checks it).
    expect = job.get("expect") or {}
    for rel, out in outputs.items():
        if rel.endswith(".py"):
            data = Path(out).read_bytes()
            if expect.get(rel) and hashlib.sha256(data).hexdigest() == expect[rel]:
                continue
            try:
                compile(data, rel, "exec", dont_inherit=True)
            except SyntaxError as exc:
                raise ValueError(f"the fixed {rel} does not compile: {exc.msg} at line {exc.lineno}") from exc
    return {"outputs": outputs, "anchors": anchors}


def execute(job: dict) -> int:
    """Guard writes, compute the fix's outputs, print the result as one JSON line."""
    _guard_writes(job["stage_dir"])
    try:
        result = run(job)
    except Exception as exc:  # reported to the driver; the driver decides the exit code
        report = {"error": f"{type(exc).__name__}: {exc}"}
        if isinstance(exc, OSError) and exc.errno:
            report["errno"] = exc.errno  # a full or read-only disk is the environment's fault, not the fix's
        print(json.dumps(report))
        return 1
    print(json.dumps(result))
    return 0


def main() -> int:
    return execute(json.loads(sys.stdin.read()))


if __name__ == "__main__":
    sys.exit(main())
