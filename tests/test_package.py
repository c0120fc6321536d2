"""The package surface: lazy public API, light import, the CLI entry point."""

from __future__ import annotations

import subprocess
import sys

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


def test_doctor_runs():
    from oar.cli import main

    assert main(["doctor"]) == 0
