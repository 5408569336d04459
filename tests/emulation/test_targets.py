"""SwitchProcess: a switch process started, crashed and restarted on the same address.

No interfaces are bound, so neither root nor veth is needed; the reference target always runs,
BMv2 where it is installed.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from finsy.proto import p4r, p4r_grpc

from emulation.targets import SwitchProcess, TargetUnavailableError
from kvcast import p4constants as c

Get = p4r.GetForwardingPipelineConfigRequest


def _start(kind: str, tmp_path: Path) -> SwitchProcess:
    try:
        return SwitchProcess(kind, [], tmp_path / f"{kind}.log")
    except TargetUnavailableError as exc:
        pytest.skip(f"{kind}: {exc}")


def _pipeline_code(address: str) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        stub = p4r_grpc.P4RuntimeStub(channel)
        try:
            stub.GetForwardingPipelineConfig(Get(device_id=1, response_type=Get.COOKIE_ONLY))
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("kind", ["refswitch", "bmv2"])
def test_a_restarted_switch_comes_back_empty_on_the_same_address(kind: str, tmp_path: Path) -> None:
    switch = _start(kind, tmp_path)
    try:
        pid, address = switch.proc.pid, switch.address
        switch.client.insert(
            c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER,
            {"bucket": 1},
            c.ACTION_INGRESS_POOL_OWNER_SET_POOL,
            {"pool_ip": 0x0A000001},
        )
        switch.restart()
        assert switch.proc.pid != pid and switch.address == address
        assert _pipeline_code(address) == grpc.StatusCode.FAILED_PRECONDITION
        switch.restart(install=True)
        assert _pipeline_code(address) == grpc.StatusCode.OK
        assert switch.client.table_entries(c.TABLE_INGRESS_POOL_OWNER_POOL_OWNER) == []
    finally:
        switch.close()
