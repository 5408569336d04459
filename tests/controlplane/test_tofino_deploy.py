"""The deploy files of a 4-pipe Tofino-1 (deploy/tofino): the controller takes them as they are.

``deploy/tofino/kvcast.yaml`` is parsed by the controller's own loader against the committed
Tofino P4Info and a stand-in of the compiler's output (the real one is a build output): four
pipes, one fan-out port in each, the 4-pipe CPU port, and a compile made for another CPU port
is refused by name. ``chassis_config.pb.txt`` gives Stratum a port for every host and pool
node of that config.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.config import parse_config
from controlplane.errors import ConfigError
from emulation.targets import REPO

from .test_targets import compiler_output

DEPLOY = REPO / "deploy" / "tofino"


def _raw(tmp_path: Path, cpu_define: str | None) -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load((DEPLOY / "kvcast.yaml").read_text())
    (switch,) = raw["switches"]
    assert (DEPLOY / switch["p4info"]).resolve() == REPO / "p4src/build/tofino/kvcast.p4info.txtpb"
    out = tmp_path / f"build-{cpu_define}"
    out.mkdir()
    conf = compiler_output(out)
    defines = [] if cpu_define is None else [f"CPU_PORT_NUM={cpu_define}"]
    (conf.parent / "manifest.json").write_text(
        json.dumps({"programs": [{"source_files": {"defines": defines}}]})
    )
    switch["device_config"] = str(conf)
    switch["epoch_state_file"] = str(tmp_path / "epoch")
    return raw


def test_the_4_pipe_config_loads_with_a_fanout_port_in_every_pipe(tmp_path: Path) -> None:
    cfg = parse_config(_raw(tmp_path, "320"), base=DEPLOY)
    (switch,) = cfg.switches
    assert switch.pipes == 4 and switch.cpu_port == 320
    assert sorted(p >> 7 for p in switch.fanout_ports) == [0, 1, 2, 3]
    assert len(cfg.hosts) == 6 and len(cfg.pools) == 2


def test_a_compile_for_another_cpu_port_is_refused_by_name(tmp_path: Path) -> None:
    refused = r"cpu_port: 320, but .* compiled for CPU port 192 \(make p4-tofino CPU_PORT=320"
    with pytest.raises(ConfigError, match=refused):
        parse_config(_raw(tmp_path, "192"), base=DEPLOY)
    with pytest.raises(ConfigError, match="CPU_PORT_NUM='x' is not a port"):
        parse_config(_raw(tmp_path, "x"), base=DEPLOY)
    # A compile that took sizes.p4's default records no define: nothing to compare.
    assert parse_config(_raw(tmp_path, None), base=DEPLOY).switches[0].cpu_port == 320


def test_the_chassis_config_brings_up_a_port_for_every_host_and_pool() -> None:
    text = (DEPLOY / "chassis_config.pb.txt").read_text()
    ports = re.findall(r"singleton_ports \{(.*?)\n\}", text, flags=re.S)
    names = [re.search(r'name: "(\d+)/0"', p) for p in ports]
    assert all(names) and len({m.group(1) for m in names if m}) == len(ports)
    assert all("ADMIN_STATE_ENABLED" in p and "node: 1" in p for p in ports)
    # kvcast.yaml names each host and pool node's front-panel port in a comment.
    config = (DEPLOY / "kvcast.yaml").read_text()
    front = re.findall(r"port: \d+, .*# (\d+)/0|port: \d+\}\s+# (\d+)/0", config)
    used = {a or b for a, b in front}
    assert len(used) == 8 and used <= {m.group(1) for m in names if m}


def test_a_host_or_pool_on_the_cpu_or_a_fanout_port_is_refused(tmp_path: Path) -> None:
    raw = _raw(tmp_path, "320")
    raw["hosts"][0]["port"] = 320
    with pytest.raises(ConfigError, match=r"hosts\[0\]\.port: 'gpu1' on port 320 .* its CPU port"):
        parse_config(raw, base=DEPLOY)
    raw = _raw(tmp_path, None)
    raw["pools"][1]["port"] = 324
    with pytest.raises(ConfigError, match=r"pools\[1\]\.port: 'pool2' on port 324 .* fan-out"):
        parse_config(raw, base=DEPLOY)
