"""fixpack commit: turn the tree prepared by `fixpack edit` into the fix, then re-lock."""

from __future__ import annotations

from pathlib import Path

from fixpack.cli.commands._common import pack_of


def add_parser(sub):
    p = sub.add_parser("commit", help="write the fix from the tree `fixpack edit` prepared (or check a codemod against it), then re-lock")
    p.add_argument("id")
    p.add_argument("--pack", type=Path, help="the fixpack repository (default: the one this fixpack runs from)")
    p.add_argument("--no-lock", action="store_true", help="leave the lock as it is (re-lock later with `fixpack lock`)")
    p.add_argument("--keep", action="store_true", help="keep the workspace after a successful commit")
    p.set_defaults(run=run)


def run(args) -> int:
    import json
    import shutil

    from fixpack.errors import FixpackError
    from fixpack.proofs import authoring
    from fixpack.sources import release

    pack = pack_of(args)
    ws = authoring.workspace(pack, args.id)
    done = authoring.commit(pack, args.id)
    meta = ws.meta()
    print(f"{args.id}: the edit changes {', '.join(done['changed'])}")
    for path in done["written"]:
        print(f"  wrote {path}")
    if done.get("check"):
        print(f"  {done['check']}")
    if done["written"] and not args.no_lock:
        profile = pack.profile(meta["profile"])
        pristine = Path(meta["pristine"]) if meta.get("pristine") else None

        def make_tree(dest: Path) -> Path:
            assert pristine is not None
            shutil.copytree(pristine, dest / "tree", symlinks=True)
            return dest / "tree"

        manifest = json.loads(profile.manifest_path.read_text())["files"]
        pack = pack_of(args)  # the fix's files as now written
        try:
            data = release.build_lock(pack, profile, manifest, make_tree if pristine else None, quiet=True)
        except FixpackError as exc:
            exc.args = (f"{args.id} was written to the pack, but `fixpack lock --profile {profile.name}` fails: {exc}; "
                        f"the workspace {ws.dir} is kept",)
            raise

        profile.lock_path.write_text(release.dump(data))
        print(f"  re-locked {profile.lock_path} ({len(data['selections'])} selections)")
    if not args.keep:
        shutil.rmtree(ws.dir)
    if meta["kind"] is None:
        port = f" --port {meta['port']}" if meta.get("port") else ""
        print(f"next: write the test (it must fail before the fix), then `fixpack check --profile {meta['profile']}{port} --only {args.id}`")
    return 0
