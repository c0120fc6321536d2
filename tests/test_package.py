"""The package surface: lazy public API, light import, the CLI entry point."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import oar


def test_every_public_name_resolves():
    missing = [name for name in oar.__all__ if name != "__version__" and getattr(oar, name, None) is None]
    assert not missing


def test_unknown_attribute_raises():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        oar.nope  # noqa: B018


def test_import_is_light():
    code = "import sys, oar; print(sorted(m for m in ('trl', 'transformers', 'datasets') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_credit_value_is_read_without_torch():
    """The credit grammar is pure Python: a report reads run.json's credit without importing torch."""
    code = ("import sys; from oar.credit import CreditSpec; from oar.viz.plots import Run; "
            "assert str(CreditSpec.parse('oar-p@horizon=2')) == 'oar-p@horizon=2'; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_doctor_runs():
    from oar.cli import main

    assert main(["doctor"]) == 0


# --- import rules (docs/architecture.md, "Import rules"): checked on the source, import by import ----------

SRC = Path(__file__).resolve().parents[1] / "src"
CORE = ("oar.advantages", "oar.reshape", "oar.steps", "oar.ranges", "oar.answer_span", "oar.probe", "oar.importance",
        "oar.credit", "oar.distributed", "oar.attribution", "oar.files", "oar.cache", "oar.prompts", "oar.grading",
        "oar.sampling", "oar.teacher_forcing")
HEAVY = ("transformers", "trl", "verl", "datasets", "accelerate", "deepspeed")


def _modules() -> dict[str, tuple[set[str], set[str]]]:
    """module -> (its module-level imports, every import anywhere in it), absolute names."""
    out = {}
    for path in sorted((SRC / "oar").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))

        def names(nodes) -> set[str]:
            found = set()
            for node in nodes:
                if isinstance(node, ast.Import):
                    found.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom):
                    assert node.level == 0, "oar uses absolute imports"
                    found.add(node.module)
            return found

        out[name] = (names(tree.body), names(ast.walk(tree)))
    return out


def _under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def rule_violations(mods: dict[str, tuple[set[str], set[str]]]) -> list[str]:
    """Every broken import rule of ``mods`` (see :func:`_modules`), one line each."""
    broken = []
    for mod, (top, every) in mods.items():
        oar_imports = {n for n in every if _under(n, "oar")}
        if _under(mod, *CORE):
            broken += [f"{mod} (core) imports {n} at module level" for n in top if _under(n, *HEAVY)]
            broken += [f"{mod} (core) imports {n}" for n in oar_imports if n != "oar" and not _under(n, *CORE)]
        if mod != "oar.trainer":
            broken += [f"{mod} imports trl at module level (only oar.trainer does)" for n in top if _under(n, "trl")]
        if not _under(mod, "oar.integrations.verl"):
            broken += [f"{mod} imports verl" for n in every if _under(n, "verl")]
        if not _under(mod, "oar.lab.ray_pool", "oar.integrations.verl"):  # verl schedules its workers on Ray
            broken += [f"{mod} imports ray (only oar.lab.ray_pool does)" for n in every if _under(n, "ray")]
        if _under(mod, "oar.lab"):
            broken += [f"{mod} (lab) imports {n}" for n in oar_imports if _under(n, "oar.train_run", "oar.cli")]
        if _under(mod, "oar.integrations"):
            broken += [f"{mod} (integration) imports {n}" for n in oar_imports
                       if _under(n, "oar.trainer", "oar.train_run", "oar.lab", "oar.cli", "oar.viz", "oar.eval")]
        if not _under(mod, "oar.cli"):
            broken += [f"{mod} imports the CLI ({n})" for n in oar_imports if _under(n, "oar.cli")]
    return sorted(broken)


def test_import_rules_hold():
    mods = _modules()
    assert {"oar.credit.catalogue", "oar.lab.run", "oar.trainer", "oar.integrations.verl.core"} <= set(mods)
    assert rule_violations(mods) == []


def test_import_rules_catch_violations():
    fake = {
        "oar.lab.bad": (set(), {"oar.train_run"}),  # a lazy import counts
        "oar.reshape": ({"transformers"}, {"transformers"}),
        "oar.credit.bad": (set(), {"oar.trainer"}),
        "oar.importance.lazy": (set(), {"transformers"}),  # allowed: inside a function
        "oar.integrations.verl.core": (set(), {"oar.trainer"}),
        "oar.eval.run": ({"trl"}, {"trl"}),
        "oar.lab.compare": (set(), {"ray.util"}),
    }
    assert rule_violations(fake) == [
        "oar.credit.bad (core) imports oar.trainer",
        "oar.eval.run imports trl at module level (only oar.trainer does)",
        "oar.integrations.verl.core (integration) imports oar.trainer",
        "oar.lab.bad (lab) imports oar.train_run",
        "oar.lab.compare imports ray (only oar.lab.ray_pool does)",
        "oar.reshape (core) imports transformers at module level",
    ]
