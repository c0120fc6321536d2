"""The lent GPU machine's bundle (requirements-gpu-bundle.txt) and its one command (checks/gpu_run.sh): the
bundle's pins are the tested ones, the bundle and the image hold every requirement, and the command and its stack
report fail clearly. The end-to-end rehearsal, offline, is ``make gpu-rehearsal`` (docs/scaling.md)."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from checks import gpu_stack
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def pins(path: Path) -> dict[str, str]:
    """``{canonical name: version or ""}`` of a requirements file (comments and blank lines skipped)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[str(canonicalize_name(name))] = version
    return out


def test_bundle_pins_the_versions_of_constraints():
    bundle, known = pins(ROOT / "requirements-gpu-bundle.txt"), pins(ROOT / "constraints.txt")
    assert bundle and all(bundle.values()), f"every bundled package is pinned with ==: {bundle}"
    assert {n: known.get(n) for n in bundle} == bundle


def test_bundle_and_image_hold_every_requirement_of_oar_and_the_bundle():
    bundle, image = pins(ROOT / "requirements-gpu-bundle.txt"), pins(ROOT / "requirements-gpu-image.txt")
    assert not set(bundle) & set(image), "a package is both bundled and taken from the image"
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    needed = {("oar", r) for r in deps}
    for name, version in bundle.items():
        assert md.version(name) == version, f"this environment's {name} is not the bundled one"
        needed |= {(name, r) for r in md.requires(name) or []}
    missing = []
    for who, spec in sorted(needed):
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            if str(canonicalize_name(req.name)) not in set(bundle) | set(image):
                missing.append(f"{who} needs {req.name}")
    assert not missing, missing


def fake_distribution(site: Path, name: str, requires: list[str]) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0"] + [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_stack_reports_each_unmet_requirement_of_a_bundled_package(tmp_path, monkeypatch):
    fake_distribution(tmp_path, "oar_fake_pkg", ["pytest<1", "oar-no-such-package>=2", "pytest>=1",
                                                  'oar-no-such-package; extra == "x"'])
    monkeypatch.syspath_prepend(str(tmp_path))
    assert gpu_stack.unmet(["oar_fake_pkg"]) == [
        f"oar_fake_pkg needs pytest<1, found {md.version('pytest')}",
        "oar_fake_pkg needs oar-no-such-package>=2, found missing",
    ]


def test_stack_absent_fails_naming_a_bundled_package_already_installed(tmp_path, capsys):
    (tmp_path / "oar_no_such_package-1.0-py3-none-any.whl").touch()
    assert gpu_stack.main(["--absent", str(tmp_path)]) == 0
    (tmp_path / "pytest-1.0-py3-none-any.whl").touch()
    with pytest.raises(SystemExit, match=re.escape(f"bundled packages already: pytest=={md.version('pytest')}")):
        gpu_stack.main(["--absent", str(tmp_path)])
    with pytest.raises(SystemExit, match="expected \\[--absent\\] BUNDLE_DIR holding wheels"):
        gpu_stack.main([str(tmp_path / "empty")])


def test_gpu_run_without_a_bundle_fails_in_one_line_before_building_anything(tmp_path):
    (tmp_path / "bundle").mkdir()
    env = dict(os.environ, BUNDLE=str(tmp_path / "bundle"), VENV=str(tmp_path / "venv"), OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", str(ROOT / "checks" / "gpu_run.sh"), "--smoke"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"gpu_run: no wheels in BUNDLE={tmp_path / 'bundle'} (run 'make gpu-bundle' here " \
                               "and carry .gpu-bundle)"
    assert not (tmp_path / "venv").exists() and not (tmp_path / "out").exists()
