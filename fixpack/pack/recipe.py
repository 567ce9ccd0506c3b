"""A recipe: a served configuration, as data, the launch block it renders and the check of what it names.

A recipe (recipes/<org>/<model>/recipe.yaml) names the profile and its opt-in fixes, the port,
the environment and every `vllm serve` argument. `render` gives the launch block a person runs
inside the image (`write_readme` replaces the marked block in a README, so the published block
cannot drift from the recipe); `check_recipe` proves that everything the recipe names exists:
the profile, each opt-in fix, the port, each port switch and its value, each path.
The command is fixpack/cli/commands/recipe.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from fixpack.errors import ConfigError
from fixpack.pack import schema

# key: (types, required, description), checked by schema.check_mapping (unknown keys rejected).
RECIPE_SCHEMA: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "model": ((str,), True, "the served model, <org>/<name> as on the Hugging Face hub"),
    "description": ((str,), False, "one paragraph: hardware, precision, context"),
    "profile": ((str,), True, "the fix profile applied at container start (profiles/<name>.yaml)"),
    "fixes": ((list,), True, "the profile's opt-in fixes this configuration applies"),
    "port": ((str, type(None)), False, "the port the image is built from (ports/<name>), or null"),
    "env": ((dict,), True, "exported before the fixes run: NAME: value (string or integer)"),
    "switches": ((dict,), False, "the port's switches (port.yaml `switches`), exported after env"),
    "serve": ((dict,), True, "the `vllm serve` command"),
    "notes": ((str,), False, "anything else"),
}

SERVE_SCHEMA: dict[str, tuple[tuple[type, ...], bool, str]] = {
    "args": (
        (list,),
        True,
        "in order: '--flag', or {'--flag': value}; a mapping or list value is passed as JSON; "
        "a string '$COOKBOOK/<path>' names a file of this repository",
    ),
    "model": ((str,), False, "what `vllm serve` loads when not the hub model: '$NAME', a variable the recipe exports"),
}

COOKBOOK = "$COOKBOOK/"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FLAG = re.compile(r"^--[a-z0-9][a-z0-9-]*$")
MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
BEGIN, END = "<!-- launch:begin -->", "<!-- launch:end -->"

# The serving pages' start-up line: their door fixes/apply_all.py (it runs the root apply_all.py)
# and no --port, since a start that does not name the port keeps the one the image build applied
# (the state record says which). A line longer than FIXES_WIDTH takes its opt-ins on a
# continuation line, as the pages wrap it.
APPLY_ALL = "fixes/apply_all.py"
FIXES_WIDTH = 100


# --------------------------------------------------------------------------- loading
class Recipe:
    def __init__(self, path: Path, data: dict):
        self.path = path
        self.data = data

    def exports(self) -> list[tuple[str, str, str]]:
        """(section, name, value) in the recipe's order: env first, then the port switches."""
        out = [("env", k, str(v)) for k, v in self.data["env"].items()]
        out += [("switches", k, str(v)) for k, v in self.data.get("switches", {}).items()]
        return out

    def args(self) -> list[tuple[str, object]]:
        """(flag, value) with value None for a bare flag."""
        out: list[tuple[str, object]] = []
        for a in self.data["serve"]["args"]:
            if isinstance(a, str):
                out.append((a, None))
            else:
                ((flag, value),) = a.items()
                out.append((flag, value))
        return out

    def cookbook_paths(self) -> list[tuple[str, str]]:
        """(where in the recipe, repository-relative path) for every '$COOKBOOK/...' value."""
        found = []
        for section, name, value in self.exports():
            if value.startswith(COOKBOOK):
                found.append((f"{section}.{name}", value[len(COOKBOOK) :]))
        for flag, arg in self.args():
            if isinstance(arg, str) and arg.startswith(COOKBOOK):
                found.append((f"serve.args {flag}", arg[len(COOKBOOK) :]))
        return found


def load_recipe(path: Path) -> Recipe:
    """Parse and check the recipe's shape; cross-references are `check_recipe`'s job."""
    from fixpack.pack.paths import check_relpath

    where = str(path)
    data = schema.check_mapping(schema.load_yaml(path), RECIPE_SCHEMA, where=where)
    if not MODEL.match(data["model"]):
        raise ConfigError(f"{where}: key 'model' is {data['model']!r}; expected <org>/<name>")
    schema.check_slug(data["profile"], where=f"{where}: key 'profile'")
    for i, f in enumerate(data["fixes"]):
        schema.check_slug(f, where=f"{where}: fixes[{i}]")
        if data["fixes"].index(f) != i:
            raise ConfigError(f"{where}: fixes[{i}]: {f!r} is listed twice")
    if data.get("port") is not None:
        schema.check_slug(data["port"], where=f"{where}: key 'port'")
    if data.get("switches") and data.get("port") is None:
        raise ConfigError(f"{where}: key 'switches' needs key 'port' (switches belong to a port)")
    seen: set[str] = set()
    for section in ("env", "switches"):
        for name, value in data.get(section, {}).items():
            w = f"{where}: {section}.{name}"
            if not isinstance(name, str) or not ENV_NAME.match(name):
                raise ConfigError(f"{where}: {section}: {name!r} is not an environment variable name")
            if name in seen:
                raise ConfigError(f"{w}: exported twice (env and switches)")
            seen.add(name)
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                kind = 'a boolean (quote it: "true" or "1")' if isinstance(value, bool) else type(value).__name__
                raise ConfigError(f"{w}: value must be a string or an integer, found {kind}")
            if isinstance(value, str) and value.startswith(COOKBOOK):
                check_relpath(value[len(COOKBOOK) :], where=w)
    serve = schema.check_mapping(data["serve"], SERVE_SCHEMA, where=f"{where}: serve")
    target = serve.get("model")
    if target is not None and (not target.startswith("$") or target[1:] not in data["env"]):
        raise ConfigError(f"{where}: serve.model {target!r}: write '$NAME' for a variable the recipe exports in 'env'")
    flags: set[str] = set()
    for i, a in enumerate(serve["args"]):
        w = f"{where}: serve.args[{i}]"
        if isinstance(a, dict):
            if len(a) != 1:
                raise ConfigError(f"{w}: a mapping holds one '--flag: value', found {len(a)} keys")
            ((flag, value),) = a.items()
        elif isinstance(a, str):
            flag, value = a, None
        else:
            raise ConfigError(f"{w}: expected '--flag' or {{'--flag': value}}, found {type(a).__name__}")
        if not isinstance(flag, str) or not FLAG.match(flag):
            raise ConfigError(f"{w}: {flag!r} is not a long option (--lowercase-words)")
        if flag in flags:
            raise ConfigError(f"{w}: {flag} is given twice")
        flags.add(flag)
        if isinstance(value, bool) or (value is None and isinstance(a, dict)):
            raise ConfigError(f"{w}: {flag} has value {value!r}; write a bare flag as the string '{flag}'")
        if value is not None and not isinstance(value, (str, int, float, dict, list)):
            raise ConfigError(f"{w}: {flag} has a value of type {type(value).__name__}")
        if isinstance(value, str) and value.startswith(COOKBOOK):
            check_relpath(value[len(COOKBOOK) :], where=f"{w} {flag}")
    return Recipe(path, data)


def recipe_paths(pack_root: Path) -> list[Path]:
    d = pack_root / "recipes"
    return sorted(d.glob("*/*/recipe.yaml")) if d.is_dir() else []


def find_recipe(recipe: str | None, pack_root: Path) -> Path:
    """The recipe named, or the only one in the pack."""
    if recipe:
        p = Path(recipe)
        if not p.is_file():
            raise ConfigError(f"recipe {p} does not exist")
        return p
    found = recipe_paths(pack_root)
    if len(found) == 1:
        return found[0]
    listed = ", ".join(str(p.relative_to(pack_root)) for p in found) or "none"
    raise ConfigError(f"--recipe is required (recipes: {listed})")


# --------------------------------------------------------------------------- rendering
def shell_word(value) -> str:
    """One shell word: mappings and lists as compact JSON, '$COOKBOOK/<path>' double-quoted so
    the variable expands, everything else quoted only when the shell needs it."""
    if isinstance(value, (dict, list)):
        return shlex.quote(json.dumps(value, separators=(", ", ": "), ensure_ascii=False))
    text = str(value)
    if text.startswith(COOKBOOK):
        rest = text[len(COOKBOOK) :]
        if re.search(r'["$`\\!]', rest):  # check_relpath already refused control characters
            raise ConfigError(f"{text!r}: a $COOKBOOK path cannot hold quotes, '$', '`', '\\' or '!'")
        return f'"{COOKBOOK}{rest}"'
    return shlex.quote(text)


def render(recipe: Recipe) -> str:
    d = recipe.data
    lines = [f"export {name}={shell_word(value)}" for _, name, value in recipe.exports()]
    lines += [
        "",
        f"# Fixes: the {d['profile']} profile plus this recipe's opt-in fixes, in the pack's order.",
        "# Stops with a non-zero exit code if the image does not match.",
        fixes_line(d["profile"], d["fixes"]),
        "",
    ]
    words = [f"vllm serve {serve_target(d)}"]
    for flag, value in recipe.args():
        words.append(f"  {flag}" if value is None else f"  {flag} {shell_word(value)}")
    lines += [w + " \\" for w in words[:-1]] + [words[-1]]
    return "\n".join(lines) + "\n"


def fixes_line(profile: str, opt_ins: list[str]) -> str:
    """The start-up check: apply the profile and the opt-ins, stop the start when it fails."""
    head = f'python3 "{COOKBOOK}{APPLY_ALL}" --profile {shlex.quote(profile)}'
    words = " ".join(map(shlex.quote, opt_ins))
    line = f"{head} {words} || exit 1" if words else f"{head} || exit 1"
    return f"{head} \\\n    {words} || exit 1" if words and len(line) > FIXES_WIDTH else line


def serve_target(d: dict) -> str:
    """The `vllm serve` positional: serve.model ('$NAME', checked by load_recipe), else the hub model."""
    target = d["serve"].get("model")
    return target if target else shlex.quote(d["model"])


def _rel(path: Path, root: Path):
    try:
        return path.resolve().relative_to(root.resolve())
    except ValueError:
        return path


def readme_block(recipe: Recipe, pack_root: Path, readme: Path) -> str:
    rel = _rel(recipe.path, pack_root)
    return (
        f"{BEGIN}\n"
        f"## Launch\n\n"
        f"<!-- Generated by `fixpack recipe show --recipe {rel} --write-readme {_rel(readme, pack_root)}`; edit the recipe, not this block. -->\n"
        f"Inside the port image, with `COOKBOOK=/opt/gaudi-cookbook` (this repository). `{APPLY_ALL}`\n"
        f"runs the repository's `apply_all.py`; the port applied at image build is kept.\n"
        f"\n```sh\n{render(recipe)}```\n"
        f"{END}"
    )


def write_readme(path: Path, block: str, title: str) -> str:
    """Replace the marked block, keeping every other byte; create the file if it is absent."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {title}\n\n{block}\n")
        return "created"
    text = path.read_text()
    nb, ne = text.count(BEGIN), text.count(END)
    if nb == 0 and ne == 0:
        sep = "" if text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        path.write_text(f"{text}{sep}{block}\n")
        return "appended"
    if nb != 1 or ne != 1 or text.index(BEGIN) > text.index(END):
        raise ConfigError(
            f"{path}: expected one {BEGIN} followed by one {END}, found {nb} and {ne}; fix the markers by hand"
        )
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = head + block + tail
    if new == text:
        return "unchanged"
    path.write_text(new)
    return "updated"


# --------------------------------------------------------------------------- checking
def switch_problem(port, name: str, value: str) -> str | None:
    """Why ``value`` is not valid for switch ``name`` of ``port``, or None: fixpack's one switch
    parser (fixpack/pack/switches.py), the one the port's plugin reads its switches with, so a recipe
    cannot hold a value the plugin would read differently or refuse."""
    from fixpack.pack.ports import switch_problem as problem

    return problem(port, name, value)


def _port_rules(port):
    """(the port's ``hooks.recipe_rules`` module or None, why it did not load or None)."""
    from fixpack.pack.ports import hook

    if port is None:
        return None, None
    try:
        return hook(port, "recipe_rules"), None
    except ConfigError as exc:
        return None, str(exc)


def missing_path_note(port, rel: str) -> str | None:
    """The port's own words on a serving file the recipe names and the repository lacks
    (``missing_file_note(rel)`` of its ``hooks.recipe_rules``): what the file is and how it is
    made, or why it cannot be made here. The path stays an error; the note only says why."""
    rules, _ = _port_rules(port)
    return rules.missing_file_note(rel) if rules is not None else None


def port_rule_records(port, data: dict) -> list[dict]:
    """The port's own serving rules (port.yaml ``hooks.recipe_rules``, optional): its
    ``recipe_problems(data)`` gives (rule, problem or None) for each rule the recipe can break
    (the glm-5-mxfp4 port: expert parallel for MXFP4 experts, the softmax mode, the memory cap)."""
    rules, problem = _port_rules(port)
    if problem:
        return [{"item": f"rules {port.name}", "result": "error", "detail": problem}]
    if rules is None:
        return []
    return [
        {"item": item, "result": "error" if problem else "ok", "detail": problem or f"{port.name} serving rule"}
        for item, problem in rules.recipe_problems(data)
    ]


def check_recipe(recipe: Recipe, pack) -> list[dict]:
    """One record per item the recipe names: {item, result, detail}; result is 'ok', 'error', or
    'skipped' where the item depends on a profile or port that did not load (itself an error)."""
    from fixpack.errors import FixpackError

    d = recipe.data
    records: list[dict] = []

    def ok(item, detail=""):
        records.append({"item": item, "result": "ok", "detail": detail})

    def bad(item, detail):
        records.append({"item": item, "result": "error", "detail": detail})

    def skipped(item, detail):
        records.append({"item": item, "result": "skipped", "detail": detail})

    profile = None
    try:
        profile = pack.profile(d["profile"])
        ok(f"profile {d['profile']}", f"{len(profile.entries)} fixes, {len(profile.opt_ins)} opt-in")
    except FixpackError as exc:
        bad(f"profile {d['profile']}", str(exc))

    port = None
    if d.get("port") is not None:
        try:
            port = pack.port(d["port"])
            if profile is not None and port.profile != profile.name:
                bad(
                    f"port {port.name}",
                    f"port {port.name!r} is built on profile {port.profile!r}, not {profile.name!r}",
                )
            else:
                ok(f"port {port.name}", f"{len(port.patches)} patches")
        except FixpackError as exc:
            bad(f"port {d['port']}", str(exc))

    for fid in d["fixes"]:
        item = f"fix {fid}"
        if profile is None:
            skipped(item, f"not checked: profile {d['profile']!r} did not load")
            continue
        if fid not in [e.id for e in profile.entries]:
            bad(item, f"fix {fid!r} is not in profile {profile.name} (opt-ins: {', '.join(profile.opt_ins) or 'none'})")
            continue
        if fid not in profile.opt_ins:
            bad(
                item,
                f"fix {fid!r} is a default fix of profile {profile.name}, not an opt-in; it applies without being named, so drop it from 'fixes'",
            )
            continue
        try:
            pack.fix(fid, release=profile.name)
            ok(item, "opt-in of " + profile.name)
        except FixpackError as exc:
            bad(item, f"fix {fid!r}: {exc}")

    if profile is not None and not any(r["result"] == "error" for r in records):
        try:
            n = len(pack.selection(profile, list(d["fixes"]), port))
            ok("selection", f"{n} fixes in pack order" + (f" (port {port.name} patches first)" if port else ""))
        except FixpackError as exc:
            bad("selection", str(exc))

    declared = (port.data.get("switches") or {}) if port is not None else {}
    prefix = port.data.get("switch_prefix") if port is not None else None
    for name, value in d.get("switches", {}).items():
        item = f"switch {name}"
        if port is None:
            skipped(item, f"not checked: port {d['port']!r} did not load")
        elif name not in declared:
            bad(
                item,
                f"switch {name} is not a switch of port {port.name} (port.yaml switches: {', '.join(declared) or 'none'})",
            )
        else:
            problem = switch_problem(port, name, str(value))
            if problem:
                bad(item, f"switch {name}={value}: {problem}")
            else:
                ok(
                    item,
                    f"{value} (default {declared[name].get('default') if isinstance(declared[name], dict) else declared[name]})",
                )
    for name in d["env"]:
        if port is not None and (name in declared or (isinstance(prefix, str) and prefix and name.startswith(prefix))):
            bad(
                f"env {name}",
                f"env.{name} looks like a switch of port {port.name}; list it under 'switches' so it is checked",
            )

    records += port_rule_records(port, d)

    for item_where, rel in recipe.cookbook_paths():
        item = f"path {rel}"
        p = pack.root / rel
        if p.is_file():
            ok(item, item_where)
        else:
            note = missing_path_note(port, rel) if port is not None else None
            bad(
                item,
                f"{item_where} names $COOKBOOK/{rel}, which does not exist in {pack.root}"
                + (f": {note}" if note else ""),
            )
    return records
