"""The user documents against the code: the README's command and exit-code tables, the version
and its CHANGELOG entry, and every relative link of the README, CONTRIBUTING, CHANGELOG and docs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

import fixpack
from fixpack import errors
from fixpack.cli.main import main

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = [README, REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]


def _help_commands(capsys) -> set[str]:
    """The sub-commands `python -m fixpack --help` lists (its usage line's `{a,b,...}`)."""
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    listed = re.search(r"\{([a-z,-]+)\}", capsys.readouterr().out)
    assert listed, "no {command,...} list in fixpack --help"
    return set(listed.group(1).split(","))


def _readme_table_commands() -> set[str]:
    """Every `fixpack NAME` in the first column of the README's commands table."""
    text = README.read_text()
    table = re.search(r"<!-- commands:begin.*?-->\n(.*?)<!-- commands:end -->", text, re.S)
    assert table, "README.md has no <!-- commands:begin --> ... <!-- commands:end --> table"
    names = set()
    for row in table.group(1).splitlines():
        if row.startswith("| `"):
            first_column = row.split("|")[1]
            names.update(re.findall(r"`fixpack ([a-z-]+)", first_column))
    return names


def test_readme_command_table_has_every_command_of_help_and_no_other(capsys):
    in_help, in_table = _help_commands(capsys), _readme_table_commands()
    assert in_help - in_table == set(), (
        f"fixpack --help has commands the README's table lacks: {sorted(in_help - in_table)}"
    )
    assert in_table - in_help == set(), (
        f"the README's table names commands fixpack --help does not have: {sorted(in_table - in_help)}"
    )


def test_readme_exit_code_table_matches_the_error_classes():
    classes = {
        cls.exit_code: cls.label
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.FixpackError) and cls is not errors.FixpackError
    }
    text = README.read_text().split("### Exit codes", 1)[1]
    rows = {int(m.group(1)): m.group(2).strip() for m in re.finditer(r"^\| (\d+) \|([^|]*)\|", text, re.M)}
    assert {code: label for code, label in rows.items() if label} == classes


def test_version_is_one_in_pyproject_and_the_package_and_has_a_changelog_section():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert fixpack.__version__ == version
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M), (
        f"CHANGELOG.md has no '## [{version}] - DATE' section"
    )
    assert "## [Unreleased]" in changelog


def _anchors(md: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in md.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_their_anchors_resolve(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading with that anchor")
    assert broken == []
