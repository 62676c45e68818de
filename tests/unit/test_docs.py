"""The README stays a front door, and what it claims agrees with the documents behind it.

- It is short, and shows the install and test commands in its first screen, exactly as .ci/run
  runs them (CI runs "the README's commands": they must not drift apart; CI adds only pip's
  --quiet).
- Every feature its "What runs" section names is a row of docs/USING.md's table, and a feature it
  calls carried is not `no` there (nor the reverse): the README once said cuBLAS was carried in
  one place and unsupported in another.
- Every relative link in the README and the docs names a file that exists, and a `#anchor` a
  heading of that file.
- docs/ARCHITECTURE.md's subsystem documents each open with the line saying what they own.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
USING = ROOT / "docs" / "USING.md"
ARCH_DIR = ROOT / "docs" / "architecture"
MAX_README_LINES = 130
FIRST_SCREEN = 40


def readme_lines() -> list[str]:
    return README.read_text().splitlines()


def ci_commands() -> tuple[str, str]:
    """.ci/run's install command and its test commands joined with && (as the README gives them)."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()

    def commands_after(marker: str) -> list[str]:
        start = next(i for i, line in enumerate(lines) if line.startswith(marker))
        block = []
        for line in lines[start + 1:]:
            if not line.strip():
                break
            block.append(line.strip())
        return block

    install = commands_after("# The README's install command")
    tests = commands_after("# The README's test command")
    assert len(install) == 1 and tests, ".ci/run no longer marks the README's commands"
    # CI installs quietly; the README shows the same command without pip's --quiet
    return install[0].replace(" --quiet", ""), " && ".join(tests)


def test_readme_is_short() -> None:
    assert len(readme_lines()) <= MAX_README_LINES


def test_readme_shows_cis_commands_in_its_first_screen() -> None:
    install, tests = ci_commands()
    first = [line.strip() for line in readme_lines()[:FIRST_SCREEN]]
    assert install in first, f"the README's first {FIRST_SCREEN} lines lack `{install}`"
    assert tests in first, f"the README's first {FIRST_SCREEN} lines lack `{tests}`"


def readme_features() -> dict[str, bool]:
    """feature -> carried, from the README's "What runs" bullets ("- Carried: a; b; ...",
    "- Not carried: ...")."""
    text = README.read_text()
    section = text.split("## What runs", 1)[1].split("\n## ", 1)[0]
    features: dict[str, bool] = {}
    for bullet in re.findall(r"^- (.*?)(?=^- |\Z)", section, re.M | re.S):
        label, _, names = bullet.partition(":")
        carried = label.strip().lower() == "carried"
        assert carried or label.strip().lower() == "not carried", f"unknown bullet {label!r}"
        for name in names.split(";"):
            features[" ".join(name.split())] = carried
    return features


def using_table() -> dict[str, str]:
    """feature (lower case) -> its `carried` cell, from docs/USING.md's table."""
    rows: dict[str, str] = {}
    for line in USING.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4 and cells[1] in ("yes", "partly", "no"):
            rows[cells[0].lower()] = cells[1]
    return rows


def test_every_readme_feature_is_in_the_guide() -> None:
    features, table = readme_features(), using_table()
    assert len(features) >= 10 and len(table) >= 10
    for name, carried in features.items():
        assert name.lower() in table, f"README names `{name}`, docs/USING.md's table does not"
        cell = table[name.lower()]
        assert (cell != "no") == carried, f"`{name}`: README says carried={carried}, USING.md `{cell}`"


def test_every_guide_row_is_in_the_readme() -> None:
    features = {name.lower() for name in readme_features()}
    missing = sorted(set(using_table()) - features)
    assert not missing, f"docs/USING.md rows the README's What runs does not name: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def documents() -> list[Path]:
    docs = [README, ROOT / "deploy" / "README.md", ROOT / "bench" / "RESULTS.md"]
    return docs + sorted((ROOT / "docs").glob("*.md")) + sorted(ARCH_DIR.glob("*.md"))


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(doc: Path) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        assert path.exists(), f"{doc.relative_to(ROOT)} links to missing {target}"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{doc.relative_to(ROOT)}: no heading for {target}"


def test_readme_links_the_guides() -> None:
    text = README.read_text()
    for doc in ("docs/USING.md", "docs/OPERATIONS.md", "docs/ARCHITECTURE.md", "deploy/README.md",
                "docs/POLICIES.md", "docs/SECURITY.md", "bench/RESULTS.md"):
        assert f"]({doc})" in text, f"README does not link {doc}"


def test_docs_name_only_real_pilotctl_commands() -> None:
    from pilot.cli.pilotctl import main as pilotctl

    for doc in (README, ROOT / "docs" / "OPERATIONS.md"):
        pattern = r"(?:^\s*|`)pilotctl (\w+)(?: (set|get|list|unset)\b)?"  # commands, not prose
        used = set(re.findall(pattern, doc.read_text(), re.M))
        assert used, f"{doc.name} shows no pilotctl command"
        for cmd, sub in used:
            assert cmd in pilotctl.commands, f"{doc.name} uses `pilotctl {cmd}`"
            if sub:
                assert sub in pilotctl.commands[cmd].commands, f"{doc.name}: `pilotctl {cmd} {sub}`"


def test_architecture_documents_say_what_they_own() -> None:
    subsystems = sorted(ARCH_DIR.glob("*.md"))
    assert subsystems, "docs/architecture/ is empty"
    index = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    for doc in subsystems:
        lines = [line for line in doc.read_text().splitlines() if line.strip()]
        assert lines[0].startswith("# "), f"{doc.name} does not open with its title"
        assert lines[1].startswith("Owns: "), f"{doc.name}: second line must be `Owns: ...`"
        assert f"architecture/{doc.name}" in index, f"docs/ARCHITECTURE.md does not link {doc.name}"


def test_results_open_with_the_headline() -> None:
    """bench/RESULTS.md's first section is the latest run of each benchmark, before the history."""
    headings = [line for line in (ROOT / "bench" / "RESULTS.md").read_text().splitlines()
                if line.startswith("## ")]
    assert headings[0].startswith("## Headline"), headings[0]
    assert all(h[3:7].isdigit() for h in headings[1:]), "history sections are dated, newest first"
    dates = [h[3:13] for h in headings[1:]]
    assert dates == sorted(dates, reverse=True), "history is not newest first"
