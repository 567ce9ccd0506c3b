"""The proof key (fixpack/proofs/reuse.py, check.fix_key): each kind of input a proof reads is in
it, so changing any one of them forces a new proof; the ledger reuses a proof only under an
identical key and names what changed when it does not."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from fixpack.proofs import check, reuse

ENV = {"venv": "v1", "python": "p1", "cpu": "c1"}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def pack(tmp_path):
    """A repository with a pytest configuration, a helper package two imports deep (one import
    in a function body, one relative), a data file beside a helper, and a fix with one test."""
    root = tmp_path / "repo"
    write(root / "pyproject.toml", '[tool.pytest.ini_options]\npythonpath = [".", "ports/p"]\n')
    write(root / "helpers" / "__init__.py", "")
    write(root / "helpers" / "mod.py", "from . import deep\n")
    write(root / "helpers" / "deep.py", "def f():\n    import portpkg.core\n    return portpkg.core.X\n")
    write(root / "helpers" / "table.json", "{}\n")
    write(root / "ports" / "p" / "portpkg" / "__init__.py", "")
    write(root / "ports" / "p" / "portpkg" / "core.py", "X = 1\n")
    write(root / "helpers" / "unused.py", "Y = 2\n")
    fix = root / "fixes" / "f1"
    write(fix / "fix.yaml", "id: f1\ntests: [test_f1.py]\n")
    write(fix / "patch.diff", "--- a/x\n+++ b/x\n")
    write(fix / "test_f1.py", "import numpy\nimport helpers.mod\n\ndef test_x():\n    assert helpers.mod\n")
    return root


def key_of(root: Path, **over) -> reuse.Key:
    fix = root / "fixes" / "f1"
    args = {
        "chain": ["v0.26.0", [{"fix": "f1", "files": {"vllm/x.py": ["a", "b"]}}]],
        "release": ["manifest-digest", "release base 0.26.0", {"vllm": {"version": "0.26.0"}}],
        "proof_code": "proof-1",
        "options": reuse.digest_of({"parts": True, "requires": True}),
        "env": dict(ENV),
    }
    args.update(over)
    return check.fix_key(fix, [fix / "test_f1.py"], **args)


def changed(before: reuse.Key, after: reuse.Key) -> list[str]:
    return after.changed(before.parts)


def test_the_same_inputs_give_the_same_key(pack):
    assert key_of(pack).digest == key_of(pack).digest


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        ("fixes/f1/fix.yaml", ["fix"]),
        ("fixes/f1/patch.diff", ["fix"]),
        ("fixes/f1/test_f1.py", ["fix", "tests"]),
        ("helpers/mod.py", ["tests"]),  # imported by the test
        ("helpers/deep.py", ["tests"]),  # imported by a relative import
        ("ports/p/portpkg/core.py", ["tests"]),  # imported in a function body, another import root
        ("helpers/table.json", ["tests"]),  # data beside an imported module
    ],
)
def test_a_changed_file_forces_a_new_proof(pack, edit, expect):
    before = key_of(pack)
    with open(pack / edit, "a") as f:
        f.write("\n# changed\n")
    assert changed(before, key_of(pack)) == expect


def test_the_pytest_configuration_is_an_input_and_the_rest_of_pyproject_is_not(pack):
    before = key_of(pack)
    with open(pack / "pyproject.toml", "a") as f:
        f.write('addopts = "-x"\n')  # still inside [tool.pytest.ini_options]
    assert changed(before, key_of(pack)) == ["tests"]
    again = key_of(pack)
    with open(pack / "pyproject.toml", "a") as f:
        f.write("\n[tool.ruff]\nline-length = 99\n")
    assert changed(again, key_of(pack)) == []


def test_a_conftest_above_the_fix_is_an_input(pack):
    before = key_of(pack)
    write(pack / "fixes" / "conftest.py", "import pytest\n")
    assert changed(before, key_of(pack)) == ["tests"]


def test_a_module_the_tests_do_not_import_is_not_an_input(pack):
    before = key_of(pack)
    (pack / "helpers" / "unused.py").write_text("Y = 3\n")
    assert changed(before, key_of(pack)) == []


@pytest.mark.parametrize(
    ("over", "expect"),
    [
        ({"chain": ["v0.26.0", [{"fix": "f1", "files": {"vllm/x.py": ["a", "c"]}}]]}, ["chain"]),
        ({"chain": ["v0.30.0", [{"fix": "f1", "files": {"vllm/x.py": ["a", "b"]}}]]}, ["chain"]),
        ({"release": ["manifest-digest-2", "release base 0.26.0", {"vllm": {"version": "0.26.0"}}]}, ["release"]),
        (
            {"release": ["manifest-digest", "development base main 091bbad", {"vllm": {"version": "0.26.0"}}]},
            ["release"],
        ),
        ({"proof_code": "proof-2"}, ["proof"]),
        ({"options": reuse.digest_of({"parts": False, "requires": True})}, ["options"]),
        ({"env": {**ENV, "venv": "v2"}}, ["venv"]),
        ({"env": {**ENV, "python": "p2"}}, ["python"]),
        ({"env": {**ENV, "cpu": "c2"}}, ["cpu"]),
    ],
)
def test_a_changed_input_forces_a_new_proof(pack, over, expect):
    assert changed(key_of(pack), key_of(pack, **over)) == expect


def test_the_environment_parts_follow_the_installed_distributions(monkeypatch):
    import importlib.metadata as md

    class Dist:
        def __init__(self, name, version):
            self.metadata = {"Name": name}
            self.version = version

    monkeypatch.setattr(md, "distributions", lambda: [Dist("torch", "2.13.0"), Dist("vllm", "0.26.0")])
    one = reuse.distributions_digest()
    monkeypatch.setattr(md, "distributions", lambda: [Dist("torch", "2.13.0"), Dist("vllm", "0.27.0")])
    assert reuse.distributions_digest() != one
    monkeypatch.setattr(md, "distributions", lambda: [Dist("torch", "2.13.0"), Dist("vllm", "0.26.0"), Dist("x", "1")])
    assert reuse.distributions_digest() != one


def test_the_proof_code_follows_what_the_proof_modules_import(tmp_path, monkeypatch):
    """A copy of fixpack: editing a module the proof code imports changes the digest."""
    real = Path(check.proof_pkg_parent()) / "fixpack"
    shutil.copytree(real, tmp_path / "fixpack", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(check, "proof_pkg_parent", lambda: str(tmp_path))
    before = check.proof_code_digest()
    closure = reuse.import_closure([tmp_path / "fixpack" / rel for rel in check.PROOF_CODE], [tmp_path])
    # a module reached only through imports (not a PROOF_CODE entry itself)
    deep = next(p for p in closure if p.name == "hashing.py")
    with open(deep, "a") as f:
        f.write("\n# changed\n")
    assert check.proof_code_digest() != before


def test_the_import_closure_leaves_out_third_party_modules(pack):
    closure = reuse.import_closure([pack / "fixes" / "f1" / "test_f1.py"], [pack, pack / "ports" / "p"])
    names = {p.relative_to(pack).as_posix() for p in closure}
    assert "helpers/deep.py" in names and "ports/p/portpkg/core.py" in names
    assert not any("numpy" in n for n in names)
    assert "helpers/unused.py" not in names


def test_the_ledger_reuses_only_under_the_identical_key(tmp_path, pack):
    ledger = reuse.Ledger("v0.26.0", root=tmp_path / "ledger")
    key = key_of(pack)
    assert ledger.lookup("f1", key) == (None, "no earlier proof")
    ledger.store("f1", key, {"fix": "f1", "result": "proven"})
    entry, why = ledger.lookup("f1", key)
    assert entry is not None and entry["record"]["result"] == "proven"
    assert why.startswith("unchanged since ") and key.short in why
    other = key_of(pack, proof_code="proof-2", env={**ENV, "venv": "v2"})
    entry, why = ledger.lookup("f1", other)
    assert entry is None and why.endswith(": proof, venv")


def test_a_damaged_ledger_entry_is_a_miss(tmp_path, pack):
    ledger = reuse.Ledger("v0.26.0", root=tmp_path / "ledger")
    ledger.dir.mkdir(parents=True)
    (ledger.dir / "f1.json").write_text("{not json")
    assert ledger.lookup("f1", key_of(pack))[0] is None
    (ledger.dir / "f1.json").write_text('{"key": "x"}')
    assert ledger.lookup("f1", key_of(pack)) == (None, "earlier proof malformed")
