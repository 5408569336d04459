"""Fixtures shared by test packages.

``data_path`` runs a test once on the native data path (kvcast._native) and once on the
pure-Python fallback: modules that use it say ``pytestmark = pytest.mark.usefixtures("data_path")``.
"""

from __future__ import annotations

import pytest

from kvcast.native import native


@pytest.fixture(params=["native", "python"])
def data_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Selects the data path through ``KVCAST_NATIVE`` for the test's clients and servers."""
    if request.param == "native" and native is None:
        pytest.skip("kvcast._native not built (make setup compiles it with gcc and python3-dev)")
    monkeypatch.setenv("KVCAST_NATIVE", "1" if request.param == "native" else "0")
    return str(request.param)
