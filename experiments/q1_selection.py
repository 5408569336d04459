"""Q1 (which prefixes deserve switch SRAM): entry point for experiments.sim.q1.

Run: ``python -m experiments.q1_selection [--quick] [--out DIR]``.
"""

from __future__ import annotations

import sys

from experiments.sim.q1 import main

if __name__ == "__main__":
    sys.exit(main())
