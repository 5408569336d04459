"""Target profiles: the Tofino device config for Stratum and the P4Info names per target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from finsy.proto import p4i

from controlplane.config import parse_config
from controlplane.errors import ConfigError
from controlplane.p4rt import SwitchClient, SwitchConfig, load_p4info
from controlplane.targets import (
    Target,
    device_config_for,
    local_p4info,
    pack_bf_pipeline_config,
    unpack_bf_pipeline_config,
)
from emulation.targets import P4INFO_PATH
from kvcast import p4constants as c


def compiler_output(tmp_path: Path, pipelines: int = 1) -> Path:
    """A directory laid out as the Tofino compiler leaves it, with a relative-path .conf."""
    out = tmp_path / "kvcast.tofino"
    (out / "pipe").mkdir(parents=True)
    (out / "bf-rt.json").write_text('{"tables": []}')
    entries = []
    for i in range(pipelines):
        d = out / f"pipe{i}" if i else out / "pipe"
        d.mkdir(exist_ok=True)
        (d / "context.json").write_text(json.dumps({"pipe": i}))
        (d / "tofino.bin").write_bytes(bytes([0xB0 + i]) * 64)
        entries.append(
            {
                "p4_pipeline_name": d.name,
                "context": f"{d.name}/context.json",
                "config": f"{d.name}/tofino.bin",
                "pipe_scope": [i * 2, i * 2 + 1] if pipelines > 1 else [0, 1, 2, 3],
                "path": d.name,
            }
        )
    conf = {
        "chip_list": [{"chip_family": "tofino", "instance": 0}],
        "p4_devices": [
            {
                "device-id": 0,
                "p4_programs": [
                    {
                        "program-name": "kvcast",
                        "bfrt-config": "bf-rt.json",
                        "p4_pipelines": entries,
                    }
                ],
            }
        ],
    }
    (out / "kvcast.conf").write_text(json.dumps(conf))
    return out / "kvcast.conf"


def tofino_named(p4info: p4i.P4Info) -> p4i.P4Info:
    """The v1model P4Info named the way the Tofino backend names entities (``pipe.`` prefix)."""
    out = p4i.P4Info()
    out.CopyFrom(p4info)
    for section in ("tables", "registers", "counters", "direct_counters", "digests"):
        for ent in getattr(out, section):
            ent.preamble.name = f"pipe.{ent.preamble.name}"
    for act in out.actions:
        if "." in act.preamble.name:
            act.preamble.name = f"pipe.{act.preamble.name}"
    return out


def test_pack_reads_every_file_the_conf_names_relative_to_its_directory(tmp_path: Path) -> None:
    conf = compiler_output(tmp_path, pipelines=2)
    got = unpack_bf_pipeline_config(pack_bf_pipeline_config(conf))
    assert got.p4_name == "kvcast"
    assert got.bfruntime_info == b'{"tables": []}'
    assert [p.name for p in got.profiles] == ["pipe", "pipe1"]
    assert [p.pipe_scope for p in got.profiles] == [(0, 1), (2, 3)]
    assert got.profiles[1].binary == bytes([0xB1]) * 64
    assert json.loads(got.profiles[1].context) == {"pipe": 1}


def test_packed_bytes_use_the_field_numbers_of_stratums_bf_proto(tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "b.json").write_bytes(b"{}")
    (out / "c.json").write_bytes(b"C")
    (out / "t.bin").write_bytes(b"T")
    conf = out / "k.conf"
    conf.write_text(
        json.dumps(
            {
                "p4_devices": [
                    {
                        "p4_programs": [
                            {
                                "program-name": "k",
                                "bfrt-config": "b.json",
                                "p4_pipelines": [
                                    {
                                        "p4_pipeline_name": "p",
                                        "context": "c.json",
                                        "config": "t.bin",
                                        "pipe_scope": [0, 2],
                                    }
                                ],
                            }
                        ]
                    }
                ]
            }
        )
    )
    # BfPipelineConfig{1: p4_name, 2: bfruntime_info, 3: Profile{1: name, 2: context,
    # 3: binary, 4: packed pipe_scope}}, as in stratum/hal/lib/barefoot/bf.proto.
    profile = b"\x0a\x01p" + b"\x12\x01C" + b"\x1a\x01T" + b"\x22\x02\x00\x02"
    expected = b"\x0a\x01k" + b"\x12\x02{}" + b"\x1a" + bytes([len(profile)]) + profile
    assert pack_bf_pipeline_config(conf) == expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["p4_devices"].append(d["p4_devices"][0]), "exactly one entry in p4_devices"),
        (
            lambda d: d["p4_devices"][0]["p4_programs"].append({}),
            "exactly one entry in p4_devices[0].p4_programs",
        ),
        (
            lambda d: d["p4_devices"][0]["p4_programs"][0]["p4_pipelines"][0].update(
                pipe_scope=[-1]
            ),
            "pipe_scope must be a list of pipe numbers",
        ),
        (
            lambda d: d["p4_devices"][0]["p4_programs"][0]["p4_pipelines"][0].update(
                config="pipe/missing.bin"
            ),
            "cannot read p4_pipelines[0].config",
        ),
    ],
)
def test_a_conf_stratum_cannot_load_is_a_config_error(
    tmp_path: Path, change: object, message: str
) -> None:
    conf = compiler_output(tmp_path)
    doc = json.loads(conf.read_text())
    change(doc)  # type: ignore[operator]
    conf.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        pack_bf_pipeline_config(conf)


def test_device_config_per_target(tmp_path: Path) -> None:
    conf = compiler_output(tmp_path)
    bmv2 = tmp_path / "kvcast.json"
    bmv2.write_text("{}")
    assert device_config_for(Target.REFERENCE, None) == b""
    assert device_config_for(Target.BMV2, bmv2) == b"{}"
    assert unpack_bf_pipeline_config(device_config_for(Target.TOFINO, conf)).p4_name == "kvcast"
    with pytest.raises(ConfigError, match="needs device_config"):
        device_config_for(Target.TOFINO, None)
    with pytest.raises(ConfigError, match="takes no device_config"):
        device_config_for(Target.REFERENCE, bmv2)


def test_tofino_names_lose_the_pipeline_prefix_and_keep_their_ids() -> None:
    v1 = load_p4info(P4INFO_PATH)
    local = local_p4info(tofino_named(v1), Target.TOFINO)
    for section in ("tables", "actions", "registers", "counters", "direct_counters", "digests"):
        want = {(e.preamble.id, e.preamble.name) for e in getattr(v1, section)}
        assert {(e.preamble.id, e.preamble.name) for e in getattr(local, section)} == want


def test_other_targets_keep_the_p4info_as_it_is() -> None:
    named = tofino_named(load_p4info(P4INFO_PATH))
    assert local_p4info(named, Target.BMV2) is named


def test_a_prefix_that_would_merge_two_names_is_refused() -> None:
    p4info = p4i.P4Info()
    p4info.tables.add().preamble.MergeFrom(p4i.Preamble(id=0x02000001, name="pipe.T"))
    p4info.tables.add().preamble.MergeFrom(p4i.Preamble(id=0x02000002, name="T"))
    with pytest.raises(ConfigError, match="share the name 'T'"):
        local_p4info(p4info, Target.TOFINO)


def test_tofino_client_pushes_the_compilers_names_and_resolves_the_drivers(
    tmp_path: Path,
) -> None:
    p4info_file = tmp_path / "kvcast.p4info.txtpb"
    p4info_file.write_text(str(tofino_named(load_p4info(P4INFO_PATH))))
    client = SwitchClient(
        SwitchConfig(
            name="tofino1",
            address="127.0.0.1:1",
            p4info=p4info_file,
            device_config=compiler_output(tmp_path),
            target=Target.TOFINO,
        )
    )
    pushed = {t.preamble.name: t.preamble.id for t in client.p4info.tables}
    table = client.schema.tables[c.TABLE_INGRESS_CACHE_CACHE_TABLE]
    assert pushed[f"pipe.{c.TABLE_INGRESS_CACHE_CACHE_TABLE}"] == table.id


def test_config_target_defaults_and_checks(tmp_path: Path) -> None:
    conf = compiler_output(tmp_path)
    base = {"hosts": [], "pools": []}
    ref = parse_config({**base, "switches": [{"name": "s", "address": "127.0.0.1:9559"}]})
    assert ref.switches[0].target is Target.REFERENCE
    tof = parse_config(
        {
            **base,
            "switches": [
                {
                    "name": "s",
                    "address": "127.0.0.1:9559",
                    "target": "tofino",
                    "device_config": str(conf),
                    "cpu_port": 192,
                    "fanout_ports": [68, 196],
                }
            ],
        }
    )
    assert tof.switches[0].target is Target.TOFINO
    with pytest.raises(ConfigError, match=r"switches\[0\].target: unknown target 'tofino2'"):
        parse_config(
            {**base, "switches": [{"name": "s", "address": "1.2.3.4:1", "target": "tofino2"}]}
        )
    with pytest.raises(ConfigError, match="target tofino needs a device_config"):
        parse_config(
            {**base, "switches": [{"name": "s", "address": "1.2.3.4:1", "target": "tofino"}]}
        )
