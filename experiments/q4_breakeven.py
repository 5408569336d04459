"""Q4 (overheads against benefits, break-even): entry point for experiments.sim.q4.

Run: ``python -m experiments.q4_breakeven [--quick] [--out DIR]``.
"""

from __future__ import annotations

import sys

from experiments.sim.q4 import main

if __name__ == "__main__":
    sys.exit(main())
