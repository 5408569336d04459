"""kvcast.lifecycle.Service: ``with`` starts the service and stops it however the block ends."""

from __future__ import annotations

import pytest

from kvcast.lifecycle import Service


class _Recorder(Service):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")


def test_with_starts_then_stops_and_gives_the_service() -> None:
    svc = _Recorder()
    with svc as got:
        assert got is svc and svc.calls == ["start"]
    assert svc.calls == ["start", "stop"]


def test_an_exception_in_the_block_still_stops_it_and_propagates() -> None:
    svc = _Recorder()
    with pytest.raises(RuntimeError, match="boom"), svc:
        raise RuntimeError("boom")
    assert svc.calls == ["start", "stop"]


def test_the_base_has_no_service_of_its_own() -> None:
    with pytest.raises(NotImplementedError):
        Service().start()
