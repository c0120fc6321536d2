"""The arithmetic lab: a CPU testbed where token-level credit assignment can be measured.

Importing it registers the lab-only oracle credits (:mod:`oar.lab.oracle`).
"""

from oar.lab import oracle as _oracle  # noqa: F401  (registers oracle-blame, oracle-process, oracle-oar)
