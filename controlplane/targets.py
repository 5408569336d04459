"""Target profiles: what differs between the switches the control plane programs.

The drivers are the same on every target: they name P4 entities as the v1model program does
(``KvcastIngress.cache.cache_table``) and write P4Runtime entities. What differs is confined
here:

* the **device config** pushed with the P4Info: nothing for the reference target, the BMv2 JSON
  for BMv2, and for a Tofino behind Stratum (``stratum_bfrt``) a serialized
  ``stratum.hal.barefoot.BfPipelineConfig`` (Stratum's ``bf.proto``) built from the Tofino
  compiler's output: the program name, ``bf-rt.json``, and one profile per pipeline with its
  ``context.json``, ``tofino.bin`` and the hardware pipes it is loaded into;
* the **names**: the Tofino backend prefixes every P4Info name with the pipeline's name
  (``pipe.KvcastIngress.cache.cache_table``). The switch gets the compiler's P4Info unchanged
  (Stratum matches its names against ``bf-rt.json``); the client's own schema gets a copy with
  the prefix removed and every id kept, so the drivers' names resolve and the ids on the wire
  are the compiler's. A digest is named by its ``Digest`` instance on Tofino
  (``KvcastIngressDeparser.hot_miss_digest``) and by its struct type on v1model
  (``hot_miss_digest_t``); the local schema names a Tofino digest by its type too.

``BfPipelineConfig`` is encoded with a message class built at import time from a descriptor
(fields and numbers as in Stratum's ``bf.proto``), so no generated code or protoc is needed.

Classes:
    Target: the kinds of switch (reference, bmv2, tofino).
    BfProfile: one pipeline profile of a Tofino program.
    BfPipeline: a Tofino program as Stratum receives it.

Functions:
    pack_bf_pipeline_config: the p4_device_config for stratum_bfrt from the compiler's .conf.
    unpack_bf_pipeline_config: the inverse, for tests and inspection.
    device_config_for: the device config bytes a target needs from its configured file.
    compiled_cpu_port: the CPU port a Tofino compile was given, from its manifest.
    local_p4info: the P4Info the client's schema uses (pipeline prefix removed, digests named
        by their type, ids kept).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from finsy.proto import p4i
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from controlplane.errors import ConfigError


class Target(enum.StrEnum):
    """The kinds of switch the control plane knows.

    REFERENCE: the Python reference target (``refswitch``): no device config.
    BMV2: simple_switch_grpc: the BMv2 JSON from p4c-bm2-ss.
    TOFINO: a Tofino running Stratum (``stratum_bfrt``): the Tofino compiler's ``.conf``
        output, packed into a BfPipelineConfig.
    """

    REFERENCE = "reference"
    BMV2 = "bmv2"
    TOFINO = "tofino"


# ------------------------------------------------------------------------ BfPipelineConfig
def _bf_pipeline_class() -> Any:
    """Builds the BfPipelineConfig message class (field numbers as in Stratum's bf.proto)."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="kvcast/stratum_bf.proto", package="stratum.hal.barefoot", syntax="proto3"
    )
    msg = fdp.message_type.add(name="BfPipelineConfig")
    f = descriptor_pb2.FieldDescriptorProto
    profile = msg.nested_type.add(name="Profile")
    profile.field.add(name="profile_name", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    profile.field.add(name="context", number=2, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    profile.field.add(name="binary", number=3, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    profile.field.add(name="pipe_scope", number=4, type=f.TYPE_UINT32, label=f.LABEL_REPEATED)
    msg.field.add(name="p4_name", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    msg.field.add(name="bfruntime_info", number=2, type=f.TYPE_BYTES, label=f.LABEL_OPTIONAL)
    msg.field.add(
        name="profiles",
        number=3,
        type=f.TYPE_MESSAGE,
        label=f.LABEL_REPEATED,
        type_name=".stratum.hal.barefoot.BfPipelineConfig.Profile",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("stratum.hal.barefoot.BfPipelineConfig")
    )


_BF_PIPELINE_CONFIG = _bf_pipeline_class()


@dataclass(frozen=True)
class BfProfile:
    """One pipeline profile of a Tofino program.

    Attributes:
        name: the pipeline's name in the program (``pipe``).
        context: the compiler's ``context.json``.
        binary: the compiler's ``tofino.bin``.
        pipe_scope: the hardware pipes this profile is loaded into.
    """

    name: str
    context: bytes
    binary: bytes
    pipe_scope: tuple[int, ...]


@dataclass(frozen=True)
class BfPipeline:
    """A Tofino program as Stratum receives it in ``p4_device_config``.

    Attributes:
        p4_name: the program's name.
        bfruntime_info: the compiler's ``bf-rt.json``.
        profiles: one per pipeline of the program.
    """

    p4_name: str
    bfruntime_info: bytes
    profiles: tuple[BfProfile, ...]


def _read(base: Path, name: object, what: str, conf: Path) -> bytes:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{conf}: {what} is missing or not a path")
    path = Path(name)
    if not path.is_absolute():
        path = base / path
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{conf}: cannot read {what} {path}: {exc}") from exc


def pack_bf_pipeline_config(conf: Path) -> bytes:
    """Packs the Tofino compiler's output into the p4_device_config that stratum_bfrt takes.

    Args:
        conf: the ``<program>.conf`` JSON the compiler writes into its output directory
            (``p4_devices[0].p4_programs[0]`` with ``program-name``, ``bfrt-config`` and
            ``p4_pipelines``). Relative paths in it are taken from the file's directory.

    Returns:
        The serialized BfPipelineConfig.

    Raises:
        ConfigError: the file is unreadable, not the compiler's format, names more than one
            device or program (Stratum loads one), or a file it names cannot be read.
    """
    try:
        doc = json.loads(conf.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the Tofino compiler's conf {conf}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{conf} is not JSON: {exc}") from exc
    devices = doc.get("p4_devices") if isinstance(doc, dict) else None
    if not isinstance(devices, list) or len(devices) != 1:
        raise ConfigError(f"{conf}: expected exactly one entry in p4_devices")
    programs = devices[0].get("p4_programs") if isinstance(devices[0], dict) else None
    if not isinstance(programs, list) or len(programs) != 1:
        raise ConfigError(f"{conf}: expected exactly one entry in p4_devices[0].p4_programs")
    program = programs[0]
    name = program.get("program-name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{conf}: program-name is missing")
    pipelines = program.get("p4_pipelines")
    if not isinstance(pipelines, list) or not pipelines:
        raise ConfigError(f"{conf}: the program has no p4_pipelines")
    base = conf.parent
    msg = _BF_PIPELINE_CONFIG(
        p4_name=name, bfruntime_info=_read(base, program.get("bfrt-config"), "bfrt-config", conf)
    )
    for i, pipe in enumerate(pipelines):
        where = f"p4_pipelines[{i}]"
        scope = pipe.get("pipe_scope")
        if not isinstance(scope, list) or not all(isinstance(p, int) and p >= 0 for p in scope):
            raise ConfigError(f"{conf}: {where}.pipe_scope must be a list of pipe numbers")
        pname = pipe.get("p4_pipeline_name")
        if not isinstance(pname, str) or not pname:
            raise ConfigError(f"{conf}: {where}.p4_pipeline_name is missing")
        msg.profiles.add(
            profile_name=pname,
            context=_read(base, pipe.get("context"), f"{where}.context", conf),
            binary=_read(base, pipe.get("config"), f"{where}.config", conf),
            pipe_scope=scope,
        )
    return bytes(msg.SerializeToString(deterministic=True))


def unpack_bf_pipeline_config(blob: bytes) -> BfPipeline:
    """Decodes a serialized BfPipelineConfig.

    Args:
        blob: what :func:`pack_bf_pipeline_config` (or Stratum's bf_pipeline_builder) made.

    Returns:
        The program, its bf-rt.json and its profiles.
    """
    msg = _BF_PIPELINE_CONFIG.FromString(blob)
    return BfPipeline(
        p4_name=msg.p4_name,
        bfruntime_info=bytes(msg.bfruntime_info),
        profiles=tuple(
            BfProfile(p.profile_name, bytes(p.context), bytes(p.binary), tuple(p.pipe_scope))
            for p in msg.profiles
        ),
    )


def compiled_cpu_port(conf: Path) -> int | None:
    """The CPU port a Tofino compile was given (``-DCPU_PORT_NUM``), from its manifest.

    The compiler writes ``manifest.json`` beside the ``.conf``, with the compile's defines
    (``make p4-tofino CPU_PORT=320`` adds ``CPU_PORT_NUM=320``).

    Returns:
        The port, or None where the manifest is absent or the compile took ``sizes.p4``'s
        default (no define).

    Raises:
        ConfigError: the manifest is unreadable, or its define is not a port number.
    """
    manifest = conf.parent / "manifest.json"
    if not manifest.exists():
        return None
    try:
        doc = json.loads(manifest.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the Tofino compiler's manifest {manifest}: {exc}") from exc
    programs = doc.get("programs", []) if isinstance(doc, dict) else []
    for program in programs if isinstance(programs, list) else []:
        sources = program.get("source_files", {}) if isinstance(program, dict) else {}
        for define in sources.get("defines", []) if isinstance(sources, dict) else []:
            name, _, value = str(define).partition("=")
            if name == "CPU_PORT_NUM":
                try:
                    return int(value, 0)
                except ValueError:
                    raise ConfigError(f"{manifest}: CPU_PORT_NUM={value!r} is not a port") from None
    return None


# ------------------------------------------------------------------------ per target
def device_config_for(target: Target, path: Path | None) -> bytes:
    """The p4_device_config a target needs.

    Args:
        target: the kind of switch.
        path: the configured device-config file: the BMv2 JSON, or the Tofino compiler's
            ``.conf``; None for the reference target.

    Returns:
        The bytes to push (empty for the reference target).

    Raises:
        ConfigError: a target that needs a file has none, or the file cannot be used.
    """
    if target is Target.REFERENCE:
        if path is not None:
            raise ConfigError("the reference target takes no device_config")
        return b""
    if path is None:
        what = (
            "the BMv2 JSON (p4src/build/kvcast.json)"
            if target is Target.BMV2
            else ("the Tofino compiler's .conf (p4src/build/tofino/.../kvcast.conf)")
        )
        raise ConfigError(f"target {target.value} needs device_config: {what}")
    if target is Target.TOFINO:
        return pack_bf_pipeline_config(path)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read device config {path}: {exc}") from exc


# P4Info sections whose entities have a preamble with a name.
_NAMED = (
    "tables",
    "actions",
    "action_profiles",
    "counters",
    "direct_counters",
    "meters",
    "direct_meters",
    "registers",
    "digests",
    "value_sets",
)


def local_p4info(p4info: p4i.P4Info, target: Target, pipeline: str = "pipe") -> p4i.P4Info:
    """The P4Info the client's schema uses: names as the drivers write them, ids unchanged.

    On Tofino the compiler names entities ``<pipeline>.<control path>``
    (``pipe.KvcastIngress.cache.cache_table``); the prefix is removed wherever it stands. A
    digest takes the name of its struct type (``hot_miss_digest_t``), as p4c's v1model backend
    names it, where the P4Info gives one. Other targets get the P4Info back as it is.

    Args:
        p4info: the compiler's P4Info (what is pushed to the switch).
        target: the kind of switch.
        pipeline: the TNA ``Pipeline`` instance's name in the program (``pipe``).

    Returns:
        The P4Info for the local schema.

    Raises:
        ConfigError: removing the prefix would make two entities share a name.
    """
    if target is not Target.TOFINO:
        return p4info
    prefix = f"{pipeline}."
    out = p4i.P4Info()
    out.CopyFrom(p4info)
    for digest in out.digests:
        if digest.type_spec.HasField("struct") and digest.type_spec.struct.name:
            digest.preamble.name = digest.type_spec.struct.name
    for section in _NAMED:
        seen: dict[str, int] = {}
        for ent in getattr(out, section):
            if ent.preamble.name.startswith(prefix):
                ent.preamble.name = ent.preamble.name[len(prefix) :]
            other = seen.setdefault(ent.preamble.name, ent.preamble.id)
            if other != ent.preamble.id:
                raise ConfigError(
                    f"removing the pipeline prefix {prefix!r} makes two {section} share the "
                    f"name {ent.preamble.name!r}"
                )
    return out
