"""The planning command: a recipe's memory per card by purpose, its predicted step times with the op
classes that dominate, and the side-by-side table against every figure the seed pages publish.
Every number it prints for a card is a PREDICTION of ``hpu_emulation.cost``, never a measurement.

    PYTHONPATH=emulation:ports/glm-5-3-flash:ports/glm-5-mxfp4:. .venv-cpu/bin/python -m hpu_emulation.plan \\
        --recipe recipes/zai-org/GLM-5.3-Flash/recipe.yaml [--card gaudi2|gaudi3] [--check] [--fit]

GLM-5.3-Flash needs vLLM 0.26.0 (``.venv-cpu``: the port's model is built through vLLM's config);
GLM-5.3 (``recipes/zai-org/GLM-5.3-BF16``) runs in ``.venv`` too. ``--fit`` re-fits the calibration
constants on the write-up's rows (GLM-5.3-Flash, vLLM needed) and uses them. Exit 0; with
``--check`` 1 when the recipe's memory exceeds the card or (GLM-5.3-Flash) its expert path misses
the serving page's floors; 2 when the recipe cannot be planned.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hpu_emulation.cost import CARDS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpu_emulation.plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", required=True, type=Path, help="a recipe.yaml (recipes/zai-org/*/recipe.yaml)")
    ap.add_argument("--card", choices=sorted(CARDS), default="gaudi2")
    ap.add_argument("--check", action="store_true", help="exit 1 when the memory or a floor fails")
    ap.add_argument("--fit", action="store_true", help="re-fit the calibration constants first (vLLM needed)")
    ns = ap.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from hpu_emulation.cost import report

    cal = None
    if ns.fit:
        from hpu_emulation.cost import calibrate, flash

        fitted = calibrate.fit(flash.FlashModel(Path("recipes/zai-org/GLM-5.3-Flash/recipe.yaml")))
        print(calibrate.render(fitted), end="\n\n")
        cal = fitted.calibration
    try:
        rep = report.report(ns.recipe, CARDS[ns.card], cal)
    except (ValueError, FileNotFoundError) as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 2
    print(rep.render())
    if ns.check and not (rep.fits and rep.floors_met):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
