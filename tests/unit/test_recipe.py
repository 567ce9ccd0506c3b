"""fixpack recipe show/check, the README launch block, and the serving chat template.

The recipe under test is the repository's own (recipes/zai-org/GLM-5.3-Flash/recipe.yaml),
checked against a small pack built in tmp_path that holds exactly what it names; each test
that breaks one item expects exit 2 and a message naming that item.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from fixpack.cli.main import main
from packtests.recipes import as_in_image, edited, seed_page, write_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "zai-org" / "GLM-5.3-Flash" / "recipe.yaml"
TEMPLATE_REL = "ports/glm-5-3-flash/serving/chat_template.jinja"
TEMPLATE = REPO / TEMPLATE_REL

# The serving page's launch block, its start-up line included (the port is kept from the image
# build: tests/release/test_launch_lines.py); a repository path is "$COOKBOOK/...".
EXPECTED = """\
export PT_HPU_LAZY_MODE=1
export VLLM_SKIP_WARMUP=true
export VLLM_ENGINE_ITERATION_TIMEOUT_S=7200
export VLLM_RPC_TIMEOUT=7200000
export VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1800
export GLM5_NEXT_VISION=1
export GLM5_NEXT_IMAGE_MAX_TOKENS=2048
export GLM5_NEXT_KDA_SCAN=1
export GLM5_NEXT_DECODE_LAYER_GROUP=45
export GLM5_NEXT_MHC_SINKHORN=kernel

# Fixes: the v0.26.0 profile plus this recipe's opt-in fixes, in the pack's order.
# Stops with a non-zero exit code if the image does not match.
python3 "$COOKBOOK/fixes/apply_all.py" --profile v0.26.0 glm47-streaming-text-markers || exit 1

vllm serve zai-org/GLM-5.3-Flash \\
  --tensor-parallel-size 8 \\
  --enable-expert-parallel \\
  --dtype bfloat16 \\
  --max-model-len 262144 \\
  --max-num-seqs 32 \\
  --num-gpu-blocks-override 1280 \\
  --max-num-batched-tokens 8192 \\
  --max-cudagraph-capture-size 2048 \\
  --enable-chunked-prefill \\
  --gpu-memory-utilization 0.82 \\
  --no-enable-prefix-caching \\
  --trust-remote-code \\
  --reasoning-parser glm47 \\
  --tool-call-parser glm47 \\
  --enable-auto-tool-choice \\
  --default-chat-template-kwargs '{"reasoning_effort": "high"}' \\
  --chat-template "$COOKBOOK/ports/glm-5-3-flash/serving/chat_template.jinja" \\
  --limit-mm-per-prompt '{"image": 4}'
"""

SWITCHES = {
    "GLM5_NEXT_VISION": {"default": 1, "type": "bool", "reference": 1, "meaning": "m"},
    "GLM5_NEXT_IMAGE_MAX_TOKENS": {"default": 2048, "type": "int", "min": 1, "reference": 2048, "meaning": "m"},
    "GLM5_NEXT_KDA_SCAN": {"default": "auto", "type": "bool", "reference": 0, "meaning": "m"},
    "GLM5_NEXT_DECODE_LAYER_GROUP": {"default": 45, "type": "int", "min": 1, "max": 45, "reference": 1, "meaning": "m"},
    "GLM5_NEXT_MHC_SINKHORN": {
        "default": "kernel",
        "type": "enum",
        "choices": ["kernel", "torch"],
        "reference": "torch",
        "meaning": "m",
    },
}


def _fix(folder: Path, fid: str) -> None:
    folder.mkdir(parents=True)
    (folder / "fix.yaml").write_text(
        yaml.safe_dump(
            {
                "id": fid,
                "summary": "s",
                "why": "w",
                "kind": "diff",
                "targets": [{"package": "vllm", "path": "x.py"}],
                "upstream": None,
                "remove_when": "r",
                "tests": ["test_x.py"],
                "releases": {"v0.26.0": {"status": "applies"}},
            }
        )
    )
    (folder / "patch.diff").write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    (folder / "test_x.py").write_text("def test_x():\n    pass\n")


@pytest.fixture()
def pack(tmp_path):
    """A pack holding what the recipe names: profile v0.26.0 with one default fix and the
    opt-in, port glm-5-3-flash with the five switches, the chat template, and the recipe."""
    root = tmp_path / "pack"
    (root / "profiles").mkdir(parents=True)
    (root / "profiles" / "v0.26.0.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "v0.26.0",
                "base": {},
                "packages": ["vllm", "vllm_gaudi"],
                "fixes": [{"id": "async-inputs"}, {"id": "glm47-streaming-text-markers", "opt_in": True}],
            }
        )
    )
    _fix(root / "fixes" / "async-inputs", "async-inputs")
    _fix(root / "fixes" / "glm47-streaming-text-markers", "glm47-streaming-text-markers")
    port = root / "ports" / "glm-5-3-flash"
    port.mkdir(parents=True)
    (port / "port.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "glm-5-3-flash",
                "profile": "v0.26.0",
                "patches": [],
                "plugin": {"package": "glm5_next_hpu"},
                "switch_prefix": "GLM5_NEXT_",
                "switches": SWITCHES,
            },
            sort_keys=False,
        )
    )
    # no port code: the recipe check reads switch values with fixpack's one parser (fixpack/pack/switches.py)
    (root / TEMPLATE_REL).parent.mkdir(parents=True)
    shutil.copy(TEMPLATE, root / TEMPLATE_REL)
    recipe = root / "recipes" / "zai-org" / "GLM-5.3-Flash" / "recipe.yaml"
    recipe.parent.mkdir(parents=True)
    shutil.copy(RECIPE, recipe)
    return root


def recipe_of(root: Path) -> Path:
    return root / "recipes" / "zai-org" / "GLM-5.3-Flash" / "recipe.yaml"


def edit(root: Path, change) -> None:
    write_recipe(recipe_of(root), edited(recipe_of(root), change))


def run(root: Path, *argv) -> int:
    return main(["recipe", *argv, "--pack", str(root)])


# --------------------------------------------------------------------------- show
def test_show_renders_the_serving_pages_launch_block(pack, capsys):
    assert run(pack, "show") == 0
    assert capsys.readouterr().out == EXPECTED


def test_show_with_explicit_recipe_path_renders_the_same(pack, capsys):
    assert main(["recipe", "show", "--recipe", str(RECIPE), "--pack", str(REPO)]) == 0
    assert capsys.readouterr().out == EXPECTED


def test_the_rendered_block_is_the_pages_block():
    """Every line, the start-up line included (the page's own: tests/release/test_launch_lines.py
    runs it verbatim in an image the port's install.sh prepared)."""
    page = seed_page("000")
    if page is None:
        pytest.skip("the seeds folder is not beside this checkout")
    assert as_in_image(EXPECTED) in page.read_text()


def test_a_long_start_up_line_takes_its_opt_ins_on_a_continuation_line():
    from fixpack.pack.recipe import FIXES_WIDTH, fixes_line

    short = fixes_line("v0.26.0", ["a-fix"])
    assert short == 'python3 "$COOKBOOK/fixes/apply_all.py" --profile v0.26.0 a-fix || exit 1'
    assert fixes_line("v0.26.0", []) == 'python3 "$COOKBOOK/fixes/apply_all.py" --profile v0.26.0 || exit 1'
    names = ["fix-" + "x" * 40, "fix-" + "y" * 40]
    long = fixes_line("v0.26.0", names)
    assert long == 'python3 "$COOKBOOK/fixes/apply_all.py" --profile v0.26.0 \\\n    ' + " ".join(names) + " || exit 1"
    assert len(long.replace(" \\\n   ", "")) > FIXES_WIDTH  # one line would be longer than the width


def test_rendered_serve_command_parses_back_to_the_recipes_arguments(pack, capsys):
    edit(pack, lambda d: d["serve"]["args"].append({"--override-generation-config": {"note": 'it\'s "quoted" $HOME'}}))
    run(pack, "show")
    text = capsys.readouterr().out
    command = text[text.index("vllm serve") :].replace("\\\n", " ")
    argv = shlex.split(command.replace('"$COOKBOOK/', '"/opt/gaudi-cookbook/'))
    assert argv[:3] == ["vllm", "serve", "zai-org/GLM-5.3-Flash"]
    assert json.loads(argv[argv.index("--default-chat-template-kwargs") + 1]) == {"reasoning_effort": "high"}
    assert json.loads(argv[argv.index("--limit-mm-per-prompt") + 1]) == {"image": 4}
    assert json.loads(argv[argv.index("--override-generation-config") + 1]) == {"note": 'it\'s "quoted" $HOME'}
    assert argv[argv.index("--chat-template") + 1] == f"/opt/gaudi-cookbook/{TEMPLATE_REL}"
    assert argv.count("--enable-expert-parallel") == 1 and argv[argv.index("--max-model-len") + 1] == "262144"


def test_show_json_carries_the_same_block(pack, capsys):
    assert run(pack, "show", "--json") == 0
    assert json.loads(capsys.readouterr().out)["launch"] == EXPECTED


# --------------------------------------------------------------------------- write-readme
def test_write_readme_creates_a_missing_readme_with_a_heading_and_the_block(pack, tmp_path):
    readme = tmp_path / "new" / "README.md"
    assert run(pack, "show", "--write-readme", str(readme)) == 0
    text = readme.read_text()
    assert text.startswith("# GLM-5.3-Flash\n\n<!-- launch:begin -->\n## Launch\n")
    assert text.endswith("<!-- launch:end -->\n")
    assert f"```sh\n{EXPECTED}```\n" in text


def test_write_readme_replaces_only_the_marked_block(pack, tmp_path):
    readme = tmp_path / "README.md"
    before = "# Port\n\nIntro by a colleague.\n\n"
    after = "\n\n## Switches\n\nTable by a colleague.\n"
    readme.write_text(before + "<!-- launch:begin -->\nold block\n<!-- launch:end -->" + after)
    assert run(pack, "show", "--write-readme", str(readme)) == 0
    text = readme.read_text()
    assert text.startswith(before + "<!-- launch:begin -->\n## Launch\n") and text.endswith(
        "<!-- launch:end -->" + after
    )
    assert "old block" not in text and EXPECTED in text
    assert run(pack, "show", "--write-readme", str(readme)) == 0
    assert readme.read_text() == text  # a second run changes nothing


def test_write_readme_appends_the_block_to_a_readme_without_markers(pack, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Port\n\nWritten by someone else.\n")
    assert run(pack, "show", "--write-readme", str(readme)) == 0
    text = readme.read_text()
    assert text.startswith("# Port\n\nWritten by someone else.\n\n<!-- launch:begin -->\n")
    assert text.count("<!-- launch:begin -->") == 1


def test_write_readme_refuses_broken_markers(pack, tmp_path, capsys):
    readme = tmp_path / "README.md"
    original = "# Port\n<!-- launch:begin -->\nA\n<!-- launch:begin -->\n<!-- launch:end -->\n"
    readme.write_text(original)
    assert run(pack, "show", "--write-readme", str(readme)) == 2
    assert "found 2 and 1" in capsys.readouterr().err
    assert readme.read_text() == original


# --------------------------------------------------------------------------- check
def test_check_passes_when_everything_named_exists(pack, capsys):
    assert run(pack, "check") == 0
    out = capsys.readouterr().out
    for item in (
        "profile v0.26.0",
        "port glm-5-3-flash",
        "fix glm47-streaming-text-markers",
        "selection",
        "switch GLM5_NEXT_MHC_SINKHORN",
        f"path {TEMPLATE_REL}",
    ):
        assert f"{item}..." in out and "error" not in out
    assert out.rstrip().endswith("all present")


def _set(*keys, value):
    def change(d):
        node = d
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return change


BAD = {
    "unknown profile": (_set("profile", value="v0.99.0"), "unknown profile 'v0.99.0'"),
    "fix not in the profile": (
        _set("fixes", value=["glm47-streaming-text-markers", "no-such-fix"]),
        "fix 'no-such-fix' is not in profile v0.26.0",
    ),
    "default fix named as opt-in": (
        _set("fixes", value=["async-inputs"]),
        "fix 'async-inputs' is a default fix of profile v0.26.0, not an opt-in",
    ),
    "unknown port": (_set("port", value="no-such-port"), "unknown port 'no-such-port'"),
    "unknown switch": (
        _set("switches", "GLM5_NEXT_TURBO", value="1"),
        "switch GLM5_NEXT_TURBO is not a switch of port glm-5-3-flash",
    ),
    "switch value not a choice": (
        _set("switches", "GLM5_NEXT_MHC_SINKHORN", value="cuda"),
        "switch GLM5_NEXT_MHC_SINKHORN=cuda: 'cuda' is not one of kernel, torch",
    ),
    "switch value not an integer": (
        _set("switches", "GLM5_NEXT_DECODE_LAYER_GROUP", value="all"),
        "switch GLM5_NEXT_DECODE_LAYER_GROUP=all: 'all' is not an integer",
    ),
    "switch value above its maximum": (
        _set("switches", "GLM5_NEXT_DECODE_LAYER_GROUP", value="46"),
        "switch GLM5_NEXT_DECODE_LAYER_GROUP=46: 46 is above the maximum 45",
    ),
    "switch value not a boolean": (
        _set("switches", "GLM5_NEXT_VISION", value="2"),
        "switch GLM5_NEXT_VISION=2: '2' is not a boolean (accepted: 1/0, true/false, yes/no, on/off in any case)",
    ),
    "switch value not 0 or 1": (
        _set("switches", "GLM5_NEXT_VISION", value="yes"),
        "switch GLM5_NEXT_VISION=yes: 'yes': a recipe writes '1'",
    ),
    "switch value spelled another way": (
        _set("switches", "GLM5_NEXT_KDA_SCAN", value="on"),
        "switch GLM5_NEXT_KDA_SCAN=on: 'on': a recipe writes '1'",
    ),
    "auto where the default is not auto": (
        _set("switches", "GLM5_NEXT_VISION", value="auto"),
        "switch GLM5_NEXT_VISION=auto: 'auto' is not a boolean",
    ),
    "port switch hidden in env": (
        _set("env", "GLM5_NEXT_EXTRA", value="1"),
        "env.GLM5_NEXT_EXTRA looks like a switch of port glm-5-3-flash",
    ),
    "missing chat template": (
        _set("serve", "args", 16, value={"--chat-template": "$COOKBOOK/ports/glm-5-3-flash/serving/nope.jinja"}),
        "serve.args --chat-template names $COOKBOOK/ports/glm-5-3-flash/serving/nope.jinja, which does not exist",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_check_stops_with_exit_2_naming_the_missing_item(pack, capsys, case):
    change, message = BAD[case]
    edit(pack, change)
    assert run(pack, "check") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fixpack: configuration error: {recipe_of(pack)}: 1 problem(s): ")
    assert message in err


def test_check_names_an_opt_in_whose_folder_is_missing(pack, capsys):
    shutil.rmtree(pack / "fixes" / "glm47-streaming-text-markers")
    assert run(pack, "check") == 2
    assert "fix 'glm47-streaming-text-markers' has no folder" in capsys.readouterr().err


def test_check_names_a_port_built_on_another_profile(pack, capsys):
    port_yaml = pack / "ports" / "glm-5-3-flash" / "port.yaml"
    data = yaml.safe_load(port_yaml.read_text())
    data["profile"] = "v0.27.0"
    port_yaml.write_text(yaml.safe_dump(data))
    assert run(pack, "check") == 2
    assert "port 'glm-5-3-flash' is built on profile 'v0.27.0', not 'v0.26.0'" in capsys.readouterr().err


def test_check_json_lists_every_item(pack, capsys):
    edit(pack, _set("switches", "GLM5_NEXT_VISION", value="2"))
    assert run(pack, "check", "--json") == 2
    data = json.loads(capsys.readouterr().out)
    bad = [i["item"] for i in data["items"] if i["result"] == "error"]
    assert bad == ["switch GLM5_NEXT_VISION"] and data["errors"] == 1


# --------------------------------------------------------------------------- the port contract
def _edit_port(root: Path, change) -> Path:
    path = root / "ports" / "glm-5-3-flash" / "port.yaml"
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


PORT_BAD = {
    "switch without a type": (
        lambda d: d["switches"]["GLM5_NEXT_MHC_SINKHORN"].pop("type"),
        "switches.GLM5_NEXT_MHC_SINKHORN: missing key 'type'",
    ),
    "switch without a reference": (
        lambda d: d["switches"]["GLM5_NEXT_VISION"].pop("reference"),
        "switches.GLM5_NEXT_VISION: missing key 'reference'",
    ),
    "enum default not a choice": (
        lambda d: d["switches"]["GLM5_NEXT_MHC_SINKHORN"].update(default="tpc"),
        "switches.GLM5_NEXT_MHC_SINKHORN: default 'tpc': 'tpc' is not one of kernel, torch",
    ),
    "switch outside the prefix": (
        lambda d: d.update(switch_prefix="GLM_"),
        "switches.GLM5_NEXT_VISION: a switch name is upper case (A-Z, 0-9, _) and starts with GLM_",
    ),
    "no switch prefix": (lambda d: d.pop("switch_prefix"), "switch_prefix None: upper-case words ending in '_'"),
}


@pytest.mark.parametrize("case", list(PORT_BAD))
def test_check_names_the_port_yaml_and_the_switch_of_a_bad_declaration(pack, capsys, case):
    change, message = PORT_BAD[case]
    port_yaml = _edit_port(pack, change)
    assert run(pack, "check") == 2
    err = capsys.readouterr().err
    assert f"{port_yaml}: {message}" in err


def _rules_package(root: Path, name: str, body: str) -> None:
    pkg = root / "ports" / "glm-5-3-flash" / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "serving_rules.py").write_text(body)


RULES = """
def recipe_problems(data):
    return [("tp-eight", None if "--tensor-parallel-size" in str(data["serve"]) else "no TP"), ("always-wrong", "refused by the port")]


def missing_file_note(rel):
    return None
"""


def test_port_rules_run_only_through_the_hook_port_yaml_declares(pack, capsys):
    """A serving_rules.py in the port's package is not looked for by path: the port names the
    module in port.yaml hooks.recipe_rules, and fixpack imports it by that name."""
    name = f"rules_{pack.parent.name}"
    _rules_package(pack, name, RULES)
    assert run(pack, "check") == 0  # not declared: not run
    capsys.readouterr()
    _edit_port(pack, lambda d: d.update(hooks={"recipe_rules": f"{name}.serving_rules"}))
    assert run(pack, "check", "--json") == 2
    items = {i["item"]: i for i in json.loads(capsys.readouterr().out)["items"]}
    assert items["tp-eight"]["result"] == "ok" and items["tp-eight"]["detail"] == "glm-5-3-flash serving rule"
    assert items["always-wrong"] == {"item": "always-wrong", "result": "error", "detail": "refused by the port"}


@pytest.mark.parametrize(
    "hooks, body, message",
    [
        ({"recipe_checks": "x.y"}, None, "unknown hook(s) recipe_checks (known: recipe_rules)"),
        ({"recipe_rules": "not a module"}, None, "hooks.recipe_rules: 'not a module' is not a module name"),
        (
            {"recipe_rules": "{pkg}.nowhere"},
            None,
            "hooks.recipe_rules: cannot import {pkg}.nowhere: ModuleNotFoundError",
        ),
        (
            {"recipe_rules": "{pkg}.serving_rules"},
            "def recipe_problems(data):\n    return []\n",
            "hooks.recipe_rules: module {pkg}.serving_rules lacks missing_file_note (RecipeRules)",
        ),
    ],
    ids=["unknown hook", "not a module name", "no such module", "module without the protocol"],
)
def test_a_bad_hook_is_an_error_naming_the_port_yaml_and_the_hook(pack, capsys, hooks, body, message):
    pkg = f"hooks_{pack.parent.name}"
    _rules_package(pack, pkg, body or "")
    hooks = {k: v.format(pkg=pkg) for k, v in hooks.items()}
    port_yaml = _edit_port(pack, lambda d: d.update(hooks=hooks))
    assert run(pack, "check", "--json") == 2
    items = json.loads(capsys.readouterr().out)["items"]
    bad = [i for i in items if i["result"] == "error"]
    assert [i["item"] for i in bad] == ["rules glm-5-3-flash"]
    assert bad[0]["detail"].startswith(f"{port_yaml}: ") and message.format(pkg=pkg) in bad[0]["detail"]


# --------------------------------------------------------------------------- schema
SCHEMA_BAD = {
    "unknown top-level key": (_set("extra", value=1), "unknown key 'extra'"),
    "unknown serve key": (_set("serve", "entrypoint", value="x"), "serve: unknown key 'entrypoint'"),
    "missing profile": (lambda d: d.pop("profile"), "missing key 'profile'"),
    "boolean env value": (
        _set("env", "VLLM_SKIP_WARMUP", value=True),
        "env.VLLM_SKIP_WARMUP: value must be a string or an integer, found a boolean",
    ),
    "two flags in one mapping": (
        _set("serve", "args", 0, value={"--a": 1, "--b": 2}),
        "serve.args[0]: a mapping holds one '--flag: value', found 2 keys",
    ),
    "flag given twice": (
        lambda d: d["serve"]["args"].append("--enable-expert-parallel"),
        "--enable-expert-parallel is given twice",
    ),
    "flag with a null value": (
        _set("serve", "args", 1, value={"--enable-expert-parallel": None}),
        "write a bare flag as the string '--enable-expert-parallel'",
    ),
    "not a long option": (_set("serve", "args", 1, value="-x"), "'-x' is not a long option"),
    "path leaving the repository": (
        _set("serve", "args", 16, value={"--chat-template": "$COOKBOOK/../etc/passwd"}),
        "contains '..'",
    ),
    "model not org/name": (_set("model", value="GLM"), "expected <org>/<name>"),
    "switches without a port": (_set("port", value=None), "key 'switches' needs key 'port'"),
}


@pytest.mark.parametrize("case", list(SCHEMA_BAD))
def test_malformed_recipe_is_refused_by_show_and_check(pack, capsys, case):
    change, message = SCHEMA_BAD[case]
    edit(pack, change)
    for command in ("show", "check"):
        assert run(pack, command) == 2
        err = capsys.readouterr().err
        assert message in err and str(recipe_of(pack)) in err


def test_recipe_is_required_when_there_are_several(pack, capsys):
    other = pack / "recipes" / "zai-org" / "Other" / "recipe.yaml"
    other.parent.mkdir(parents=True)
    shutil.copy(recipe_of(pack), other)
    assert run(pack, "show") == 2
    assert (
        "--recipe is required (recipes: recipes/zai-org/GLM-5.3-Flash/recipe.yaml, recipes/zai-org/Other/recipe.yaml)"
        in capsys.readouterr().err
    )


# --------------------------------------------------------------------------- the chat template
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def render(messages, **kw):
    """As vLLM renders it: transformers' sandboxed Jinja environment (trim_blocks, lstrip_blocks,
    its tojson)."""
    jinja2 = pytest.importorskip("jinja2")
    import jinja2.ext  # noqa: F811  (the submodule: importorskip gave the package)
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols], undefined=jinja2.Undefined
    )
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    return env.from_string(TEMPLATE.read_text()).render(messages=messages, **kw)


def test_template_header_says_what_it_is():
    head = TEMPLATE.read_text().split("-#}", 1)[0]
    assert (
        head.startswith("{#-")
        and "GLM-5.3-Flash serving chat template" in head
        and "not copied from the checkpoint" in head
    )


def test_template_renders_text_turns_with_glm_roles():
    out = render(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ],
        add_generation_prompt=True,
        reasoning_effort="high",
    )
    assert out == (
        "[gMASK]<sop><|system|>\nReasoning effort: high<|system|>\nBe brief.<|user|>\nHi"
        "<|assistant|><think></think>Hello.<|user|>\nBye<|assistant|><think>"
    )


@pytest.mark.parametrize(
    "effort,shown", [("low", "low"), ("high", "high"), ("medium", "max"), ("max", "max"), (None, "max")]
)
def test_template_treats_any_effort_but_low_or_high_as_max(effort, shown):
    kw = {} if effort is None else {"reasoning_effort": effort}
    assert f"Reasoning effort: {shown}<|user|>" in render([{"role": "user", "content": "x"}], **kw)


def test_template_renders_tools_calls_and_grouped_responses():
    msgs = [
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "two calls",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {
                    "id": "2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "2", "content": "rain"},
    ]
    out = render(msgs, tools=[WEATHER], add_generation_prompt=True)
    assert out.startswith("[gMASK]<sop><|system|>\n# Tools\n")
    assert "<tools>\n" + json.dumps(WEATHER["function"]) + "\n</tools>" in out
    assert out.endswith(
        "<|user|>\nWeather in Paris and Oslo?<|assistant|><think>two calls</think>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
        "<|observation|><tool_response>sunny</tool_response><tool_response>rain</tool_response><|assistant|><think>"
    )
    assert "<|system|>\n# Tools" not in render([{"role": "user", "content": "x"}])


def test_template_places_one_placeholder_per_image_where_it_stands():
    image = "<|begin_of_image|><|image|><|end_of_image|>"
    content = [
        {"type": "text", "text": "Before."},
        {"type": "image_url", "image_url": {"url": "data:"}},
        {"type": "text", "text": "Between."},
        {"type": "image"},
        {"type": "text", "text": "After."},
    ]
    out = render([{"role": "user", "content": content}], add_generation_prompt=True)
    assert f"<|user|>\nBefore.{image}Between.{image}After.<|assistant|>" in out
    assert out.count("<|image|>") == 2


def test_template_renders_through_transformers_as_vllm_does():
    cu = pytest.importorskip("transformers.utils.chat_template_utils")
    out, _ = cu.render_jinja_template(
        conversations=[[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]],
        tools=[WEATHER],
        chat_template=TEMPLATE.read_text(),
        add_generation_prompt=True,
        reasoning_effort="low",
    )
    (text,) = out
    assert (
        "<|system|>\nReasoning effort: low<|user|>\n<|begin_of_image|><|image|><|end_of_image|>Colour?<|assistant|><think>"
        in text
    )
    assert '"name": "get_weather"' in text


def test_template_reads_content_parts_in_the_messages_loop_as_vllm_detects_them():
    """vLLM treats a template as OpenAI-format (and leaves image placement to it) when it loops
    over message['content'] of a `for message in messages` loop; otherwise it flattens the
    parts and puts every image placeholder first."""
    import jinja2
    import jinja2.nodes

    ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(TEMPLATE.read_text())
    loops = list(ast.find_all(jinja2.nodes.For))
    message_vars = {f.target.name for f in loops if isinstance(f.iter, jinja2.nodes.Name) and f.iter.name == "messages"}
    content_loops = [
        f
        for f in loops
        if isinstance(f.iter, jinja2.nodes.Getitem)
        and isinstance(f.iter.node, jinja2.nodes.Name)
        and f.iter.node.name in message_vars
        and isinstance(f.iter.arg, jinja2.nodes.Const)
        and f.iter.arg.value == "content"
    ]
    assert message_vars == {"message"} and len(content_loops) == 1


def test_port_readme_launch_block_is_the_one_the_recipe_renders(tmp_path):
    """The published block is generated, never edited: regenerate it with
    `fixpack recipe show --write-readme ports/glm-5-3-flash/README.md`."""
    readme = REPO / "ports" / "glm-5-3-flash" / "README.md"
    text = readme.read_text()
    assert text.count("<!-- launch:begin -->") == 1, (
        "no launch block; run fixpack recipe show --write-readme ports/glm-5-3-flash/README.md"
    )
    copy = tmp_path / "README.md"
    copy.write_text(text)
    assert main(["recipe", "show", "--recipe", str(RECIPE), "--pack", str(REPO), "--write-readme", str(copy)]) == 0
    assert copy.read_text().replace(str(copy), "ports/glm-5-3-flash/README.md") == text, (
        "stale launch block; run fixpack recipe show --write-readme ports/glm-5-3-flash/README.md"
    )
