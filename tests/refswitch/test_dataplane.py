"""The reference target's port map: interface specs, and the CPU port kept off the data plane."""

from __future__ import annotations

import pytest

from kvcast import p4constants as c
from refswitch.dataplane import Dataplane, DataplaneError, PortMap
from refswitch.pipeline import Pipeline
from refswitch.state import SwitchState


def test_interface_specs_parse_and_refuse_repeats() -> None:
    assert dict(PortMap.parse(["1@veth1", "2@veth3"])) == {1: "veth1", 2: "veth3"}
    with pytest.raises(DataplaneError, match="twice"):
        PortMap.parse(["1@a", "1@b"])
    with pytest.raises(DataplaneError, match="PORT@IFNAME"):
        PortMap.parse(["veth1"])


def test_no_interface_may_be_mapped_to_the_cpu_port() -> None:
    # Frames from it would be PacketOuts: a host there could WRITE switch SRAM.
    with pytest.raises(DataplaneError, match="CPU port"):
        Dataplane(Pipeline(SwitchState()), {1: "veth1", c.CPU_PORT_NUM: "veth9"})
    with pytest.raises(DataplaneError, match="9-bit"):
        Dataplane(Pipeline(SwitchState()), {512: "veth1"})
