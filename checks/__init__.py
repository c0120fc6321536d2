"""Acceptance checks, run by hand or on a GPU machine rather than in the test suite's fast tier.

``gpu_check.py`` (a GRPO step and the OAR scorers at Qwen2.5-1.5B's shape, ``make gpu-check``), ``gpu_run.sh`` and
``gpu_stack.py`` (the check on the lent GPU machine, offline: docs/scaling.md), ``gpu_verl.sh`` (verl + OAR-G on one
GPU of your own, ``make gpu-verl``) and ``faults.py`` (SIGKILL-and-resume trials of ``oar train``:
docs/robustness.md). Each is a script (``python checks/NAME.py --help``); the folder is a package so the tests can
import them (``from checks import gpu_check``; pytest puts the repository root on ``sys.path``, pyproject.toml).
"""
