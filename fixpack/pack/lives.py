"""Every fix's life: its status on each release of the pack, read from fix.yaml ``releases:``.

A fix of the profile layer (``fixes/<id>/``) records an entry for every profile of the pack, a
port's fix (``ports/<name>/fixes/<id>/``) one for the profile its port is built on. An entry is
that release's status (applies, refreshed, upstream, dropped, not-affected: schema.RELEASE_STATUSES);
a release without one is a gap, which ``fixpack validate`` refuses. ``fixpack list`` prints each
profile's lives, and the status tables of docs/packs.md are rendered from them
(``fixpack list --write-docs docs/packs.md``; ``--check`` compares).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fixpack import kinds
from fixpack.errors import ConfigError
from fixpack.pack import schema
from fixpack.pack.pack import Fix, Pack, Port, load_fix


@dataclass(frozen=True)
class Life:
    """Fix ``fix`` (as a whole) on release ``release``: fix.yaml's entry for it, None for a gap."""

    fix: Fix
    release: str
    role: str  # "default", "opt-in", "port <name>", or "not listed" (the profile does not select it)
    entry: dict | None

    @property
    def status(self) -> str | None:
        return self.entry["status"] if self.entry is not None else None

    @property
    def applied(self) -> bool:
        return self.status in schema.RELEASE_APPLIED

    @property
    def fix_yaml(self) -> Path:
        return self.fix.dir / "fix.yaml"


def required_releases(pack: Pack, port: Port | None) -> list[str]:
    """The releases a fix must record: every profile of the pack for a fix of the profile layer,
    the port's profile for a port's fix."""
    return [port.profile] if port is not None else pack.profile_names()


def gap_message(pack: Pack, fix_yaml: Path, release: str, port: Port | None = None) -> str:
    """What `fixpack validate` says of a fix.yaml without an entry for ``release``."""
    order = port.dir / "port.yaml" if port is not None else pack.root / "profiles" / f"{release}.yaml"
    whose = f"the profile port {port.name} is built on" if port is not None else "a profile of this pack"
    return (
        f"{fix_yaml}: releases has no entry {release!r} ({whose}, {order}): record the fix's life on it: "
        f"applies or refreshed (and list it in {order.name}, proven by `fixpack check --profile {release} "
        f"--only {fix_yaml.parent.name}`), upstream with evidence, dropped or not-affected with why"
    )


def _fix_dirs(base: Path) -> list[Path]:
    if not base.is_dir():
        return []
    return sorted(
        d for d in base.iterdir() if d.is_dir() and not d.name.startswith((".", "_")) and (d / "fix.yaml").is_file()
    )


def lives(pack: Pack, release: str) -> list[Life]:
    """Every fix of the layers of profile ``release`` on it: the profile's fixes in pack order, then
    each port built on it (its patches in their order, then its other fix folders by id), then the
    profile layer's fix folders the profile does not list, by id."""
    profile = pack.profile(release)
    out: list[Life] = []
    seen: set[Path] = set()

    def add(d: Path, role: str) -> None:
        fix = load_fix(d)
        out.append(Life(fix, release, role, fix.releases.get(release)))
        seen.add(d)

    for e in profile.entries:
        d = pack.fix_dir(e.id)
        if d.is_dir():
            add(d, "opt-in" if e.opt_in else "default")
    for name in pack.port_names():
        port = pack.port(name)
        if port.profile != release:
            continue
        for pid in port.patches:
            d = pack.fix_dir(pid, port)
            if d.is_dir():
                add(d, f"port {name}")
        for d in _fix_dirs(port.dir / "fixes"):
            if d not in seen:
                add(d, f"port {name}, not listed")
    for d in _fix_dirs(pack.root / "fixes"):
        if d not in seen:
            add(d, "not listed")
    return out


# ----------------------------------------------------------------------------- text


def first_sentence(text: str) -> str:
    """The first sentence of ``text`` on one line (whitespace collapsed)."""
    flat = " ".join(str(text).split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z(`])", flat, maxsplit=1)[0]


def status_cell(life: Life) -> str:
    """The status of ``life`` with what says why, for a table: ``refreshed (`v0.30.0/patch.diff`): ...``."""
    entry = life.entry
    if entry is None:
        return "**no entry** (`fixpack validate` refuses this)"
    status = entry["status"]
    if status == "applies":
        return "applies"
    if status == "refreshed":
        own = f"{life.release}/{kinds.CHANGE_FILES[life.fix.kind]}"
        return f"refreshed (`{own}`): {first_sentence(entry['why'])}"
    if status == "upstream":
        by = f" ({entry['upstream']})" if entry.get("upstream") else ""
        return f"upstream{by}: {first_sentence(entry['evidence'])}"
    return f"{status}: {first_sentence(entry['why'])}"


def _cell(text: str) -> str:
    """``text`` on one line for a markdown table cell: ``|`` escaped, and ``<`` / ``>`` outside code
    spans written as entities (a renderer would take ``<think>`` for a tag and hide it)."""
    parts = " ".join(str(text).split()).replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def table(pack: Pack, release: str) -> str:
    """The markdown status table of profile ``release`` (every fix of its layers)."""
    rows = [
        f"| fix | role | kind | package | status on {release} (`fixes/<id>/fix.yaml` `releases.{release}`) | CPU | defect |",
        "|---|---|---|---|---|---|---|",
    ]
    for life in lives(pack, release):
        fix = life.fix
        packages = ", ".join(dict.fromkeys(t.package for t in fix.targets))
        cpu = "yes" if fix.cpu_demonstrable else "no (device gate)"
        rows.append(
            f"| `{fix.id}` | {life.role} | {fix.kind} | {packages} | {_cell(status_cell(life))} | {cpu} | "
            f"{_cell(fix.meta['summary'])} |"
        )
    return "\n".join(rows)


# ----------------------------------------------------------------------------- docs/packs.md


def markers(release: str) -> tuple[str, str]:
    return f"<!-- fixpack:lives {release} begin -->", f"<!-- fixpack:lives {release} end -->"


def block(pack: Pack, release: str, doc: str) -> str:
    begin, end = markers(release)
    note = (
        f"<!-- Generated by `fixpack list --write-docs {doc}` from each fix's fix.yaml `releases:`; "
        "edit those, not this table. -->"
    )
    return f"{begin}\n{note}\n{table(pack, release)}\n{end}"


def render_docs(pack: Pack, path: Path, doc: str) -> tuple[str, list[str]]:
    """``path``'s text with each profile's block rendered anew, and the profiles whose block changed.

    ConfigError naming the file when a profile has no block, a block is broken, or a block names a
    profile the pack does not have."""
    text = path.read_text()
    profiles = pack.profile_names()
    named = set(re.findall(r"<!-- fixpack:lives (\S+) (?:begin|end) -->", text))
    unknown = sorted(named - set(profiles))
    if unknown:
        raise ConfigError(
            f"{path}: status table(s) for {', '.join(unknown)}, which the pack has no profile of ({', '.join(profiles)})"
        )
    changed: list[str] = []
    for release in profiles:
        begin, end = markers(release)
        nb, ne = text.count(begin), text.count(end)
        if (nb, ne) == (0, 0):
            raise ConfigError(
                f"{path}: no status table for profile {release}: put the lines `{begin}` and `{end}` where it goes, then run `fixpack list --write-docs {doc}`"
            )
        if nb != 1 or ne != 1 or text.index(begin) > text.index(end):
            raise ConfigError(
                f"{path}: expected one {begin} followed by one {end}, found {nb} and {ne}; fix the markers by hand"
            )
        head, rest = text.split(begin, 1)
        old, tail = rest.split(end, 1)
        new = block(pack, release, doc)
        if begin + old + end != new:
            changed.append(release)
        text = head + new + tail
    return text, changed


def doc_name(pack: Pack, path: Path) -> str:
    """``path`` as the generated note names it: relative to the pack when inside it."""
    try:
        return path.resolve().relative_to(pack.root.resolve()).as_posix()
    except ValueError:
        return str(path)
