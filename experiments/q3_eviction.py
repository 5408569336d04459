"""Q3 (value left in evicted chunks, demote or drop): entry point for experiments.sim.q3.

Run: ``python -m experiments.q3_eviction [--quick] [--out DIR]``.
"""

from __future__ import annotations

import sys

from experiments.sim.q3 import main

if __name__ == "__main__":
    sys.exit(main())
