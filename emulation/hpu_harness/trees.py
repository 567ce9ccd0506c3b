"""Release trees for runs on the emulation, built the way an image is: ``fixpack sources tree``
from the release-source cache, then ``apply_all.py --profile P`` (the image-build step)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TREE_ENV = "HPU_HARNESS_TREE"  # use this tree as it is (already built and patched)
SOURCE_UNAVAILABLE = 8  # fixpack's exit code when a release source cannot be had (README, exit codes)


class SourcesUnavailable(RuntimeError):
    """The release sources are not in the cache and cannot be fetched: tests skip, saying
    "SOURCE UNAVAILABLE" (CI counts those skips by source, scripts/stages.py)."""


class TreeBuildFailed(RuntimeError):
    """The sources were there and building or patching the tree failed: a failure, never a skip."""


def fixpack_python() -> Path:
    """The interpreter that has fixpack and its requirements (the project's ``.venv``)."""
    for candidate in (REPO / ".venv" / "bin" / "python", Path(sys.executable)):
        probe = subprocess.run([str(candidate), "-c", "import fixpack.sources.sources, libcst"], capture_output=True)
        if probe.returncode == 0:
            return candidate
    raise RuntimeError(f"no interpreter with fixpack installed (looked for {REPO / '.venv'}): run scripts/setup.sh")


def build(dest: Path | str, profile: str = "v0.26.0", *, patched: bool = True, extra: list[str] | None = None) -> Path:
    """Write the profile's release tree to ``dest`` and, if ``patched``, apply the profile to it."""
    dest = Path(dest)
    py = str(fixpack_python())
    run = lambda *args: subprocess.run([py, *args], cwd=REPO, check=True, capture_output=True, text=True)  # noqa: E731
    try:
        run("-m", "fixpack", "sources", "tree", str(dest), "--profile", profile)
        if patched:
            run("apply_all.py", "--profile", profile, "--root", str(dest), *(extra or []))
    except subprocess.CalledProcessError as exc:
        if exc.returncode == SOURCE_UNAVAILABLE:
            raise SourcesUnavailable(
                f"SOURCE UNAVAILABLE: the {profile} release sources: {exc.stderr.strip()[-400:]}"
            ) from None
        raise TreeBuildFailed(f"building the {profile} tree in {dest} failed:\n{exc.stdout}\n{exc.stderr}") from None
    return dest


def tree_from_env() -> Path | None:
    value = os.environ.get(TREE_ENV)
    return Path(value) if value else None


def companion_vllm(version: str, python: str | None = None) -> Path:
    """vLLM ``version``'s pristine ``vllm/`` folder from fixpack's source cache (the wheel)."""
    got = subprocess.run(
        [
            python or str(fixpack_python()),
            "-c",
            f"from fixpack.sources import sources; print(sources.wheel_tree('vllm', {version!r}, 'vllm'))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if got.returncode != 0:
        raise RuntimeError(f"vLLM {version} is not in the source cache: {got.stderr[-500:]}")
    return Path(got.stdout.strip().splitlines()[-1]) / "vllm"


def use_companion_vllm(tree: Path | str, version: str, python: str | None = None) -> Path:
    """Replace ``tree``'s ``vllm/`` by vLLM ``version``'s pristine files: a development base's
    vllm-gaudi imports with that vLLM, not with the release's (profiles/v0.30.0.yaml,
    ``imports_with``). The profile's vLLM fixes, written for the release's files, go with it."""
    tree = Path(tree)
    source = companion_vllm(version, python)
    shutil.rmtree(tree / "vllm")
    shutil.copytree(source, tree / "vllm")
    return tree
