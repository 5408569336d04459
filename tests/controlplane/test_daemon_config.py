"""The daemon's YAML configuration: defaults, the documented example, and named errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import controlplane.config as config_module
from controlplane.config import load_config, parse_config
from controlplane.configspec import SRAM_BYTES, ListenAddress
from controlplane.errors import ConfigError
from kvcast import p4constants as c
from kvcast.ports import AGENT_PORT

MINIMAL: dict[str, Any] = {"switches": [{"name": "s1", "address": "127.0.0.1:9559"}]}


def with_(**top: Any) -> dict[str, Any]:
    return {**MINIMAL, **top}


def host(name: str = "h1", **kw: Any) -> dict[str, Any]:
    n = int(name[1:])
    return {
        "name": name,
        "ip": f"10.0.0.{n}",
        "mac": f"00:00:00:00:00:{n:02x}",
        "port": n,
        "tenants": [1],
        **kw,
    }


def pool(name: str = "p1", **kw: Any) -> dict[str, Any]:
    n = int(name[1:])
    return {
        "name": name,
        "ip": f"10.0.1.{n}",
        "mac": f"00:00:00:00:01:{n:02x}",
        "port": 40 + n,
        **kw,
    }


def test_a_minimal_configuration_takes_the_documented_defaults() -> None:
    cfg = parse_config(MINIMAL)
    (sw,) = cfg.switches
    assert (sw.device_id, sw.election_id, sw.device_config) == (1, 10, None)
    assert cfg.sram_budget_bytes == SRAM_BYTES == c.NUM_FRAG_SLOTS * c.FRAG_BYTES
    assert cfg.policy.name == "kvcast" and not cfg.policy.dry_run
    assert cfg.metrics == ListenAddress("0.0.0.0", 9108)
    assert cfg.report_api.listen == ListenAddress("0.0.0.0", 9109)
    assert cfg.report_api.operators == ("127.0.0.1",)
    assert cfg.sketch.threshold == c.HOT_MISS_THRESHOLD


def test_the_example_in_the_module_docstring_is_valid(tmp_path: Path) -> None:
    doc = config_module.__doc__ or ""
    block = doc.split("A complete example", 1)[1].split("::", 1)[1].split("\nClasses:")[0]
    text = "\n".join(line[4:] for line in block.splitlines())
    path = tmp_path / "controller.yaml"
    path.write_text(text)
    cfg = load_config(path)
    assert cfg.source == path
    assert cfg.switch("s1").election_id == 20
    (p,) = cfg.pools
    assert (p.fetch_host, p.fetch_port) == ("10.254.5.2", 19286)
    (h,) = cfg.hosts
    assert (h.id, h.switch, h.udp_port) == (1, "s1", AGENT_PORT)
    assert cfg.policy.params == {"hysteresis": 0.25}


def test_hosts_and_pools_default_to_the_only_switch_and_get_ids_in_order() -> None:
    cfg = parse_config(with_(hosts=[host("h1"), host("h2")], pools=[pool("p1")]))
    assert [(h.name, h.id, h.switch) for h in cfg.hosts] == [("h1", 1, "s1"), ("h2", 2, "s1")]
    assert cfg.pools[0].switch == "s1"
    assert (cfg.pools[0].fetch_host, cfg.pools[0].fetch_port) == ("10.0.1.1", c.KVP_UDP_PORT)


def test_relative_files_are_resolved_against_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "prog.json").write_text("{}")
    path = tmp_path / "c.yaml"
    path.write_text(
        "switches:\n  - {name: s1, address: 'x:1', device_config: prog.json,"
        " epoch_state_file: state/epochs}\n"
    )
    (sw,) = load_config(path).switches
    assert sw.device_config == tmp_path / "prog.json"
    assert sw.epoch_state_file == tmp_path / "state" / "epochs"


def bad(raw: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(raw)


def test_unknown_settings_are_errors_with_a_suggestion() -> None:
    bad(with_(tick=1), "tick: unknown setting; did you mean 'tick_s'?")
    raw = {"switches": [{"name": "s1", "adress": "x:1", "address": "x:1"}]}
    bad(raw, "switches[0].adress: unknown setting; did you mean 'address'?")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "switches: required setting is missing"),
        ([], "the file: expected a mapping"),
        ({"switches": []}, "switches: at least one switch is required"),
        ({"switches": [{"name": "s1"}]}, "switches[0].address: required setting is missing"),
        ({"switches": [{"name": "s1", "address": "nohost"}]}, "is not host:port"),
        ({"switches": [{"name": "s1", "address": "h:99999"}]}, "outside 0..65535"),
        (
            {"switches": [{"name": "s1", "address": "h:1", "election_id": 0}]},
            "switches[0].election_id: 0 is outside",
        ),
        (
            {"switches": [{"name": "s1", "address": "h:1", "device_config": "/no/such.json"}]},
            "switches[0].device_config: file /no/such.json does not exist",
        ),
        (
            {"switches": [{"name": "s", "address": "h:1"}, {"name": "s", "address": "h:2"}]},
            "switches[1].name: name 's' is also used by switches[0].name",
        ),
        (with_(hosts=[host(ip="10.0.0.300")]), "hosts[0].ip: '10.0.0.300' is not an IPv4"),
        (with_(hosts=[host(mac="zz")]), "hosts[0].mac"),
        (with_(hosts=[host("h1"), host("h2", port=1)]), "hosts[1].port: switch port"),
        (with_(hosts=[host("h1"), host("h2", id=1)]), "hosts[1].id: host id 1"),
        (with_(hosts=[host(switch="s9")]), "hosts[0].switch: no switch named 's9'"),
        (with_(pools=[{"name": "p1", "ip": "10.0.1.1"}]), "pools[0]: mac and port are required"),
        (with_(pools=[pool(fetch_address="h:x")]), "pools[0].fetch_address"),
        (with_(policy={"name": "belady"}), "policy.name: 'belady' is not an online policy"),
        (with_(policy={"name": "nope"}), "policy.name: 'nope' is not an online policy"),
        (with_(policy={"params": {"hysteresis": -1}}), "policy.params:"),
        (with_(policy={"params": {"colour": 1}}), "policy.params:"),
        (with_(policy={"params": {"capacity_bytes": 5}}), "set sram_budget_bytes instead"),
        (with_(policy={"dry_run": "yes"}), "policy.dry_run: expected true or false"),
        (with_(policy={"min_accesses": 0}), "policy.min_accesses: 0 is outside 1..64"),
        (with_(policy={"min_accesses": "often"}), "policy.min_accesses: expected an integer"),
        (with_(sram_budget_bytes=SRAM_BYTES + 1), "sram_budget_bytes"),
        (with_(tick_s=0), "tick_s: expected a positive finite number"),
        (with_(sketch={"threshold": 0}), "sketch.threshold"),
        (with_(metrics={"listen": "0.0.0.0:9"}, report_api={"listen": "0.0.0.0:9"}), "both use"),
        (with_(log_level="LOUD"), "log_level"),
        (
            with_(hosts=[host()], report_api={"operators": ["127.0.0.1", "10.0.0.1"]}),
            "report_api.operators: 10.0.0.1 is a GPU host's address",
        ),
        (with_(report_api={"operators": ["ops"]}), "report_api.operators[0]: 'ops' is not an IPv4"),
        (with_(classes={"min_uses": 1}), "classes.min_uses: 1 is outside 2..65536"),
        (with_(classes={"min_span_s": 600.0}), "classes.min_span_s"),
        (with_(classes={"window": 5}), "classes.window: unknown setting; did you mean 'window_s'"),
        (with_(push={"budget_bytes_per_tick": -1}), "push.budget_bytes_per_tick"),
        (with_(hosts=[host(engine_url="10.0.0.1:8000")]), "hosts[0].engine_url: '10.0.0.1:8000'"),
        (with_(hosts=[host(engine_url="http://h")]), "hosts[0].engine_url: 'h' is not host:port"),
        (
            with_(hosts=[host(engine_url="http://h:1")], push={"budget_bytes_per_tick": 1}),
            "hosts[0].engine_url: pushing to engines needs push.budget_bytes_per_tick and "
            "push.bytes_per_token",
        ),
        (with_(push={"max_inflight": 0}), "push.max_inflight: 0 is outside 1..1024"),
    ],
)
def test_invalid_settings_are_named_by_their_path(raw: object, message: str) -> None:
    bad(raw, message)


def test_the_class_rule_takes_its_settings_and_defaults() -> None:
    config = parse_config(with_(classes={"min_uses": 3, "detect": False}))
    assert (config.classes.min_uses, config.classes.detect) == (3, False)
    assert config.classes.window_s == 600.0 and config.classes.min_span_s == 60.0
    assert parse_config(MINIMAL).push_budget_bytes == 0


def test_a_hosts_engine_url_and_the_push_sections_engine_settings_are_read() -> None:
    config = parse_config(
        with_(
            hosts=[host(engine_url="http://10.9.0.1:8000/"), host("h2")],
            push={"budget_bytes_per_tick": 1 << 20, "bytes_per_token": 4096, "model": "m"},
        )
    )
    assert [h.engine_url for h in config.hosts] == ["http://10.9.0.1:8000", None]
    spec = config.push_engines
    assert (spec.bytes_per_token, spec.model, spec.retry_s, spec.max_inflight) == (
        4096,
        "m",
        10.0,
        32,
    )


def test_metrics_can_be_turned_off() -> None:
    assert parse_config(with_(metrics=None)).metrics is None


def test_unreadable_and_non_yaml_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("switches: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_config(empty)


def _tofino(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    conf = tmp_path / "kvcast.conf"
    conf.write_text("{}")
    sw = {"name": "t1", "address": "10.0.0.2:9339", "target": "tofino",
          "device_config": str(conf), **kw}  # fmt: skip
    return {"switches": [sw]}


def test_a_tofino_names_its_cpu_port_and_one_fanout_port_per_pipe(tmp_path: Path) -> None:
    cfg = parse_config(_tofino(tmp_path, cpu_port=192, fanout_ports=[68, 196]))
    (sw,) = cfg.switches
    assert (sw.cpu_port, sw.fanout_ports, sw.pipes) == (192, (68, 196), 2)
    assert parse_config(MINIMAL).switches[0].pipes == 1


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({}, "needs cpu_port and fanout_ports"),
        ({"cpu_port": 192, "fanout_ports": []}, "one port in each pipe"),
        ({"cpu_port": 192, "fanout_ports": [68, 100]}, "one port in each pipe"),
        ({"cpu_port": 192, "fanout_ports": [68, 192]}, "must not be a fan-out port"),
        ({"cpu_port": 320, "fanout_ports": [68, 196]}, "its pipe (2) must have one"),
        ({"cpu_port": 192, "fanout_ports": [68, 600]}, "outside 0..511"),
    ],
)
def test_bad_tofino_fanout_settings_are_refused(
    tmp_path: Path, kw: dict[str, Any], message: str
) -> None:
    bad(_tofino(tmp_path, **kw), message)


def test_only_a_tofino_takes_fanout_ports() -> None:
    bad(
        {"switches": [{"name": "s1", "address": "h:1", "fanout_ports": [68]}]},
        "only a tofino switch has fanout_ports",
    )


# ---------------------------------------------------------------------- secure defaults
def test_a_host_without_tenants_is_refused_with_what_to_write() -> None:
    bare = host()
    del bare["tenants"]
    with pytest.raises(ConfigError) as err:
        parse_config(with_(hosts=[bare]))
    message = str(err.value)
    assert message.startswith("hosts[0].tenants: required")
    assert "tenants: any" in message and "'h1'" in message


@pytest.mark.parametrize("bad", [[], "all", "ANY", 3])
def test_tenants_must_be_a_list_of_ids_or_the_word_any(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"hosts\[0\]\.tenants"):
        parse_config(with_(hosts=[host(tenants=bad)]))


def test_tenants_any_is_accepted_and_logged_as_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="controlplane.config"):
        cfg = parse_config(with_(hosts=[host(), host("h2", tenants="any")]))
    assert [h.tenants for h in cfg.hosts] == [(1,), None]
    (record,) = caplog.records
    assert record.levelname == "WARNING" and record.getMessage().startswith("hosts[1].tenants:")
    assert "'h2' may ask for any tenant" in record.getMessage()
    assert cfg.unisolated() == (("tenants_any", "h2"),)


@pytest.mark.parametrize(
    ("setting", "logged", "marked"),
    [
        (
            {"program_forwarding": False},
            "switches[0].program_forwarding: false",
            "program_forwarding_off",
        ),
        (
            {"deny_unknown_ports": False},
            "switches[0].deny_unknown_ports: false",
            "deny_unknown_ports_off",
        ),
    ],
)
def test_switch_settings_that_leave_ports_unbound_are_logged(
    caplog: pytest.LogCaptureFixture, setting: dict[str, bool], logged: str, marked: str
) -> None:
    doc = {"switches": [{"name": "s1", "address": "127.0.0.1:9559", **setting}]}
    with caplog.at_level("WARNING", logger="controlplane.config"):
        cfg = parse_config(doc)
    (record,) = caplog.records
    assert record.levelname == "WARNING" and record.getMessage().startswith(logged)
    assert cfg.unisolated() == ((marked, "s1"),)


def test_the_secure_defaults_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="controlplane.config"):
        cfg = parse_config(with_(hosts=[host()], pools=[pool()]))
    (sw,) = cfg.switches
    assert sw.program_forwarding and sw.deny_unknown_ports
    assert caplog.records == [] and cfg.unisolated() == ()
