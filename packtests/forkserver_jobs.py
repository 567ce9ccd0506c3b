"""Jobs for the sandbox's fork server in the engine's tests: a codemod fix whose rewrite runs
``body`` on a one-function source, and the worker's JSON result read from a reply."""

from __future__ import annotations

import json
from pathlib import Path

SRC = "def f():\n    return 1\n"


def job(tmp_path: Path, name: str, body: str) -> dict:
    fix = tmp_path / name
    fix.mkdir()
    (fix / "codemod.py").write_text(
        "import os, sys\nimport libcst as cst\nimport libcst.matchers as m\nfrom fixpack.kinds.codemod import Codemod\n\n\n"
        "def replace_once(node, old, new):\n    return cst.parse_statement(cst.Module([]).code_for_node(node).replace(old, new, 1))\n\n\n"
        "class R(Codemod):\n    DESCRIPTION = 'test'\n    TARGET = 'pkg/t.py'\n    PLACES = ('f',)\n\n"
        "    @m.leave(m.FunctionDef(name=m.Name('f')))\n"
        "    def f(self, original, updated):\n        return self.at('f', updated, self.rewrite(updated))\n\n"
        f"    def rewrite(self, node):\n        {body}\n"
    )
    src = tmp_path / "t.py"
    src.write_text(SRC)
    stage = tmp_path / f"stage-{name}"
    stage.mkdir()
    return {
        "fix_dir": str(fix),
        "kind": "codemod",
        "stage_dir": str(stage),
        "targets": [{"rel": "pkg/t.py", "src": str(src), "out": str(stage / "0.out")}],
    }


def result(reply: dict) -> dict:
    return json.loads(reply["stdout"].strip().splitlines()[-1])
