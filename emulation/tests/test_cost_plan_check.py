"""``python -m hpu_emulation.plan --check`` on every recipe of the repository: the memory per card
fits the card and (GLM-5.3-Flash) the recipe's expert path meets the serving page's floors, by
PREDICTION (no card); a recipe changed so that its KV pool exceeds the card exits 1.

Each plan traces its model at the recipe's real shapes many times (3 to 5 minutes on 2 cores), so
this file is the long stage ``cost-plan`` (``FIXPACK_STAGES=cost-plan bash scripts/test.sh``), not
CI's; CI's ``cost-model`` stage gates the Flash floors on the recipe's own expert path
(``test_cost_flash_floors.py``) and the Flash memory plan (``test_memory_plan.py``).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("vllm", reason="the Flash port's model is built through vLLM 0.26.0's config (.venv-cpu)")

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*/*/recipe.yaml"))
PATHS = ["emulation", "ports/glm-5-3-flash", "ports/glm-5-mxfp4", "."]


def _plan(recipe: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(REPO / p) for p in PATHS))
    return subprocess.run(
        [sys.executable, "-m", "hpu_emulation.plan", "--recipe", str(recipe), "--check"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def test_every_recipe_is_planned():
    assert {r.parent.name for r in RECIPES} == {"GLM-5.3-Flash", "GLM-5.3-BF16"}, RECIPES


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.parent.name)
def test_recipe_fits_the_card_and_meets_its_floors(recipe):
    proc = _plan(recipe)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    assert out.startswith("PREDICTION for ") and "(fits: +" in out, out[:2000]
    if recipe.parent.name == "GLM-5.3-Flash":
        floors = [
            ln
            for ln in out.splitlines()
            if ln.startswith(("| decode 2K tokens/s", "| decode 128K tokens/s", "| TTFT 128K s"))
        ]
        assert len(floors) == 3 and all(ln.endswith("| meets |") for ln in floors), floors


def test_a_kv_pool_beyond_the_card_fails_the_check(tmp_path):
    """The Flash recipe with ten times its KV blocks (about 92 GiB of KV on a 96 GiB card)."""
    src = REPO / "recipes" / "zai-org" / "GLM-5.3-Flash" / "recipe.yaml"
    data = yaml.safe_load(src.read_text())
    args = data["serve"]["args"]
    at = next(i for i, a in enumerate(args) if isinstance(a, dict) and "--num-gpu-blocks-override" in a)
    args[at] = {"--num-gpu-blocks-override": 10 * int(args[at]["--num-gpu-blocks-override"])}
    recipe = tmp_path / "recipe.yaml"  # the plan reads the recipe alone (no path in it is resolved)
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = _plan(recipe)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "DOES NOT FIT" in proc.stdout, proc.stdout[:2000]
