"""Hot prefix on k pool replicas vs switch multicast: entry point for experiments.sim.replication.

Run: ``python -m experiments.replication [--quick] [--out DIR]``.
"""

from __future__ import annotations

import sys

from experiments.sim.replication import main

if __name__ == "__main__":
    sys.exit(main())
