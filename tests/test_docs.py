"""Docs that cannot drift: the OARConfig table is generated, every link and script path in the docs resolves, each
folder holds what its rule says, and a stored study table is what the package makes of its stored results."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
SCRIPT = re.compile(r"(?<![\w/.-])((?:benchmarks|checks|tests|docs/studies)/[\w./-]+\.(?:py|sh))")


def test_config_table_in_the_docs_is_generated_from_the_fields():
    from oar.config_table import config_table

    page = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    assert config_table() in page, "docs/training.md: paste the output of `python -m oar.config_table`"


def test_every_oar_config_field_is_in_one_docstring_theme():
    from oar.config_table import config_fields, docstring_themes
    from oar.trainer import OARConfig

    named = [n for names in docstring_themes(OARConfig).values() for n in names]
    fields = [f.name for f in config_fields()]
    assert sorted(named) == sorted(set(named)), f"a field is in two themes: {named}"
    assert set(named) - set(fields) == set(), "OARConfig's docstring themes name fields it does not have"
    assert set(fields) - set(named) == set(), "add the new OARConfig fields to a theme of its docstring"
    assert all(f.metadata.get("help") for f in config_fields()), "every OARConfig field needs a help text"


def test_config_table_groups_rows_by_theme_and_keeps_unthemed_fields():
    from oar.config_table import config_table

    @dataclasses.dataclass
    class Base:
        inherited: int = 0

    @dataclasses.dataclass
    class Config(Base):
        """A config.

        > Size

        width, depth
        """

        width: int = field_with_help(3, "Columns | rows.")
        depth: float = field_with_help(0.5, "Layers.")
        name: str = field_with_help("a\nb", "Name.")

    assert config_table(Config, Base).splitlines() == [
        "| field | default | meaning |", "|---|---|---|",
        "| **Size** | | |", "| `width` | `3` | Columns \\| rows. |", "| `depth` | `0.5` | Layers. |",
        "| **Other** | | |", '| `name` | `"a\\nb"` | Name. |',
    ]


def field_with_help(default, text: str):
    return dataclasses.field(default=default, metadata={"help": text})


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown page (lowercase, punctuation dropped, spaces to dashes, -N for
    repeats)."""
    seen: dict[str, int] = {}
    out = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    bad = []
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.is_dir():
            dest = dest / "README.md"
        if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target} (no such heading)")
    assert not bad, f"{page.relative_to(ROOT)}: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_script_path_named_in_the_docs_exists(page):
    missing = sorted({p for p in SCRIPT.findall(page.read_text(encoding="utf-8")) if not (ROOT / p).is_file()})
    assert not missing, f"{page.relative_to(ROOT)} names scripts that are not there: {missing}"


def test_each_folder_holds_what_its_rule_says():
    """benchmarks/: speed benchmarks (``bench_*.py``) and their shared setup (``_*.py``) only; checks/: the
    acceptance checks; docs/studies/: one folder per study, each with its page, listed in the index
    (docs/architecture.md)."""
    assert {p.name for p in (ROOT / "benchmarks").iterdir() if p.name != "__pycache__"} == \
        {p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name.startswith(("_", "bench_"))}
    studies = ROOT / "docs" / "studies"
    index = (studies / "README.md").read_text(encoding="utf-8")
    for folder in sorted(p for p in studies.iterdir() if p.is_dir()):
        page = folder / "README.md"
        assert page.is_file(), f"{folder.name}: every study has its page"
        assert re.search(r"\d{4}-\d{2}-\d{2}", page.read_text(encoding="utf-8").splitlines()[0]), \
            f"{folder.name}: the page's title carries its dates"
        assert f"]({folder.name}/)" in index, f"docs/studies/README.md does not list {folder.name}"
    manual = (ROOT / "docs" / "lab.md").read_text(encoding="utf-8")
    headings = [line for line in manual.splitlines() if line.startswith("#")]
    assert not [h for h in headings if re.search(r"issue|session|\d{4}-\d{2}", h)], \
        "the lab manual's headings carry no work dates or issue numbers (those belong to docs/studies)"


@pytest.mark.parametrize("study", ["efficiency_long_b16", "efficiency_updates_long_b16"])
def test_stored_efficiency_tables_are_what_the_package_makes_of_the_stored_results(study, tmp_path):
    from oar.lab.efficiency import write_efficiency

    stored = ROOT / "docs" / "studies" / "efficiency" / "results" / study
    write_efficiency(stored, tmp_path)
    assert (tmp_path / "efficiency.md").read_text(encoding="utf-8") == \
        (stored / "efficiency.md").read_text(encoding="utf-8")
    rows = json.loads((tmp_path / "efficiency.json").read_text(encoding="utf-8"))["rows"]
    assert rows == json.loads((stored / "efficiency.json").read_text(encoding="utf-8"))["rows"]


def test_the_library_imports_no_test_benchmark_check_or_study_code():
    import ast

    outside = {"helpers", "conftest", "trainer_setup", "checks", "benchmarks", "_probes"}
    bad = []
    for path in sorted((ROOT / "src" / "oar").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in outside]
    assert not bad, bad
