"""fixpack recipe show|check: render a recipe's launch block, or check what it names.

The recipe model, its check and its rendering are fixpack/pack/recipe.py.
"""

from __future__ import annotations

from pathlib import Path

from fixpack.cli.commands._common import emit_json, pack_of
from fixpack.errors import ConfigError
from fixpack.pack.recipe import BEGIN, END, check_recipe, find_recipe, load_recipe, readme_block, render, write_readme


def add_parser(sub):
    p = sub.add_parser("recipe", help="a served configuration: render its launch block, check what it names")
    rsub = p.add_subparsers(dest="recipe_command", required=True)
    show = rsub.add_parser("show", help="print the launch block the recipe describes")
    show.add_argument(
        "--write-readme",
        type=Path,
        metavar="PATH",
        help=f"replace the block between {BEGIN} and {END} in PATH (created if absent)",
    )
    check = rsub.add_parser(
        "check", help="every profile, fix, port, switch and path the recipe names exists and is valid"
    )
    for q in (show, check):
        q.add_argument("--recipe", help="recipe.yaml (default: the only one under recipes/)")
        q.add_argument("--pack", type=Path, help="the fixpack repository (default: the one this fixpack runs from)")
        q.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    pack = pack_of(args)
    recipe = load_recipe(find_recipe(args.recipe, pack.root))
    if args.recipe_command == "show":
        text = render(recipe)
        status = None
        if args.write_readme:
            status = write_readme(
                args.write_readme,
                readme_block(recipe, pack.root, args.write_readme),
                recipe.data["model"].split("/")[-1],
            )
        if args.json:
            emit_json(
                {
                    "recipe": str(recipe.path),
                    "launch": text,
                    "readme": str(args.write_readme) if args.write_readme else None,
                    "readme_status": status,
                }
            )
        elif status:
            print(f"{args.write_readme}: launch block {status}")
        else:
            print(text, end="")
        return 0
    records = check_recipe(recipe, pack)
    errors = [r for r in records if r["result"] == "error"]
    if args.json:
        emit_json({"recipe": str(recipe.path), "items": records, "errors": len(errors)})
    else:
        from fixpack.cli.output import Lines

        lines = Lines()
        for r in records:
            lines.line(r["item"], r["result"], r["detail"])
    if errors:
        raise ConfigError(f"{recipe.path}: {len(errors)} problem(s): " + "; ".join(r["detail"] for r in errors))
    if not args.json:
        print(f"recipe {recipe.path}: {len(records)} items checked, all present")
    return 0
