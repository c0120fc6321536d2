"""The credit-efficiency table of the headroom regime (docs/studies/efficiency): every credit as a share of the best
oracle's headroom over GRPO, both views, with the declared claim rule and the cost per update (``oar.lab.efficiency``).

    python docs/studies/efficiency/efficiency_table.py runs/efficiency \
        --out docs/studies/efficiency/results/efficiency_long_b16

Reads an ``oar compare`` directory's ``results.json`` (with oracle columns); writes ``OUT/results.json`` and
``OUT/results.md`` (copies), ``OUT/efficiency.json``, ``OUT/efficiency.md``, ``OUT/efficiency.png`` and
``OUT/curves.png`` (accuracy against updates, a panel per credit, GRPO and the best oracle in each).
"""

from __future__ import annotations

import argparse
import sys

from oar.lab.efficiency import write_efficiency


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("compare_dir", help="an oar compare directory with results.json (oracle columns included)")
    p.add_argument("--out", required=True, help="directory for the copies, efficiency.{json,md,png}")
    a = p.parse_args(argv)
    try:
        table = write_efficiency(a.compare_dir, a.out)
    except ValueError as err:
        p.error(str(err))
    sys.stdout.write(table.read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
