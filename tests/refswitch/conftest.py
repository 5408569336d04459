"""Fixtures shared by the reference pipeline's packet tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.harness import InProcessRefTarget
from tests.conformance.vectors import program_switch


@pytest.fixture(scope="module")
def target() -> Iterator[InProcessRefTarget]:
    """The reference pipeline in this process, programmed as the conformance vectors assume."""
    t = InProcessRefTarget()
    try:
        program_switch(t.client)
        yield t
    finally:
        t.close()
