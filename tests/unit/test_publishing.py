"""Ready to publish: the ``pip install`` lines of the README and docs/ install what
pyproject.toml defines, and the changelog's newest section is pyproject.toml's version."""

from __future__ import annotations

import itertools
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def install_lines() -> list[tuple[str, str]]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.rst"))]
    return [(page.name, line.strip()) for page in pages
            for line in page.read_text().splitlines() if "pip install" in line]  # fmt: skip


def test_every_extra_a_page_installs_is_defined() -> None:
    extras = set(PROJECT["optional-dependencies"])
    named = [(page, extra) for page, line in install_lines()
             for group in re.findall(r"(?:celery-extras|\.)\[([a-z0-9_,-]+)\]", line)
             for extra in group.split(",")]  # fmt: skip
    assert named, "no pip install line names an extra"
    assert [(page, extra) for page, extra in named if extra not in extras] == []


def test_the_quickstart_installs_from_a_checkout_until_the_package_is_published() -> None:
    lines = [line for page, line in install_lines() if page == "quickstart.rst"]
    assert lines and all(re.search(r"pip install -e '?\.", line) for line in lines), lines


def test_the_changelog_s_newest_section_is_the_version_with_its_date() -> None:
    lines = (ROOT / "docs" / "changelog.rst").read_text().splitlines()
    title = next(line for line, under in itertools.pairwise(lines) if set(under) == {"-"})
    assert re.fullmatch(rf"{re.escape(PROJECT['version'])} \(\d{{4}}-\d\d-\d\d\)", title), title


def test_the_readme_s_herd_figures_are_those_of_the_page_it_cites() -> None:
    readme = (ROOT / "README.md").read_text()
    quoted = re.search(r"last start ([\d.]+) s after the ETA, plain Celery ([\d.]+) s, by "
                       r"`python -m bench herd` on [\d-]+: `(docs/[\w.]+)`", readme)  # fmt: skip
    assert quoted, "the README's herd figures name no source"
    page = (ROOT / quoted[3]).read_text()
    assert f"{quoted[1]} s (plain Celery {quoted[2]} s" in page
