"""The stack checks/gpu_run.sh runs the GPU check on: versions, the GPU, and every requirement of a bundled
package that the installed versions do not meet (the bundle is installed with ``--no-deps``, so nothing else
checks them; a mismatch is reported, not fatal: the image's versions are what the device has).

    python checks/gpu_stack.py BUNDLE_DIR
    python checks/gpu_stack.py --absent BUNDLE_DIR   # fails if a bundled package is installed already
                                                         # (make gpu-rehearsal: the image stand-in lacks them all)
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename

SHOWN = ("torch", "transformers", "accelerate", "trl", "datasets", "peft", "math-verify", "numpy", "pyarrow",
         "fsspec", "huggingface_hub", "tokenizers")


def bundle_names(bundle: Path) -> list[str]:
    """Distribution names of the wheels in ``bundle`` (canonical)."""
    return sorted(str(parse_wheel_filename(w.name)[0]) for w in bundle.glob("*.whl"))


def unmet(names: list[str]) -> list[str]:
    """``"pkg needs req, found version|missing"`` for each requirement (no extras) of the installed ``names``
    that the installed distributions do not satisfy."""
    out = []
    for name in names:
        for spec in md.requires(name) or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = md.version(req.name)
            except md.PackageNotFoundError:
                out.append(f"{name} needs {req}, found missing")
                continue
            if have not in req.specifier:
                out.append(f"{name} needs {req}, found {have}")
    return out


def installed(names: list[str]) -> list[str]:
    """Those of ``names`` that are installed, as ``name==version``."""
    out = []
    for name in names:
        try:
            out.append(f"{name}=={md.version(name)}")
        except md.PackageNotFoundError:
            pass
    return out


def main(argv: list[str]) -> int:
    absent = argv[:1] == ["--absent"]
    args = argv[1:] if absent else argv
    if len(args) != 1 or not Path(args[0]).is_dir() or not bundle_names(Path(args[0])):
        sys.exit(f"gpu_stack: expected [--absent] BUNDLE_DIR holding wheels, got {argv}")
    names = bundle_names(Path(args[0]))
    if absent:
        there = installed(names)
        if there:
            sys.exit(f"gpu_stack: {sys.executable} has bundled packages already: {' '.join(there)}")
        print(f"gpu_stack: none of the {len(names)} bundled packages is installed in {sys.prefix}")
        return 0
    import torch

    import oar

    print("python", sys.version.split()[0], sys.executable)
    for name in SHOWN:
        try:
            print(name, md.version(name))
        except md.PackageNotFoundError:
            print(name, "missing")
    print("oar", oar.__version__, oar.__file__)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print("cuda", torch.version.cuda, "device:", gpu)
    import datasets  # noqa: F401  (the bundled packages import, and math-verify's LaTeX parser runs)
    import math_verify
    import trl  # noqa: F401

    if not math_verify.verify(math_verify.parse("$\\frac{1}{2}$"), math_verify.parse("0.5")):
        sys.exit("gpu_stack: math_verify does not match 1/2 with 0.5 (its LaTeX parser is broken)")
    bad = unmet(names)
    print(f"bundle ({len(names)}): {' '.join(names)}; requirements not met: {len(bad)}")
    for line in bad:
        print("  " + line)
    return 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
