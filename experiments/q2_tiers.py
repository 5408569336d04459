"""Q2 (when chunks move between tiers): entry point for experiments.sim.q2.

Run: ``python -m experiments.q2_tiers [--quick] [--out DIR]``.
"""

from __future__ import annotations

import sys

from experiments.sim.q2 import main

if __name__ == "__main__":
    sys.exit(main())
