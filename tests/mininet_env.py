"""Whether this machine can build an emulated cluster (Mininet), and if not, why."""

from __future__ import annotations

import os
import shutil


def mininet_missing() -> str:
    """Why Mininet cannot run here, or "" when it can.

    Returns:
        The skip reason: Mininet needs root (network namespaces, veth, tc) and its ``mnexec``
        (``make setup`` installs Debian's Mininet).
    """
    if os.geteuid() != 0:
        return "Mininet needs root (network namespaces, veth, tc)"
    if shutil.which("mnexec") is None:
        return "Mininet not installed: mnexec not found (make setup installs it)"
    return ""


MININET_MISSING = mininet_missing()
"""The skip reason for this process ("" where the cluster can be built)."""
