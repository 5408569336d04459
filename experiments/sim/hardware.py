"""What the cluster model is made of: KV sizes, GPU prefill cost, the switch, packet framing.

Every number here is either derived (KV bytes per token from a model's shape, switch sizes
from ``p4src/shared/sizes.p4``, header sizes from the generated constants) or a stated
assumption with its reason in the docstring next to it; the experiments print the values they
ran with.

Classes:
    KVModel: a model's KV-cache shape and prefill size: bytes per token, bytes per chunk.
    GpuSpec: prefill throughput of one GPU host (FLOP model: dense matmuls plus attention).
    SwitchSpec: the caching switch: fragment size and SRAM per pipe (from sizes.p4), pipes,
        per-pipe packet rate, control-plane rates and message sizes.
    WireFormat: KVP framing: frame bytes and wire bytes per payload byte for pool DATA (several
        fragments per frame) and for switch-served DATA (one fragment per frame).

Constants:
    MODELS: the model presets by name.
    H100: the default GPU.

Functions:
    tofino1: the Tofino-1 switch spec (sizes.p4's ``__TARGET_TOFINO__`` branch), cached.
    bmv2: the BMv2 switch spec (the generated ``kvcast.p4constants``), for the emulation.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

from kvcast import p4constants as c

__all__ = ["H100", "MODELS", "GpuSpec", "KVModel", "SwitchSpec", "WireFormat", "bmv2", "tofino1"]

_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class KVModel:
    """A model's KV-cache shape and the size that sets its prefill cost.

    Attributes:
        name: preset name.
        layers: transformer layers.
        kv_heads: KV heads (GQA).
        head_dim: dimension per head.
        bits_per_elem: stored bits per K or V element, including quantization scales.
        params: parameters (for the dense part of prefill FLOPs).
        attn_dim: query heads x head dim (for the attention part of prefill FLOPs).
        note: where the shape comes from.
    """

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    bits_per_elem: float
    params: float
    attn_dim: int
    note: str = ""

    @property
    def bytes_per_token(self) -> float:
        """2 (K and V) x layers x kv_heads x head_dim x bits / 8."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bits_per_elem / 8

    def chunk_bytes(self, tokens: int) -> int:
        """Bytes of one chunk of ``tokens`` tokens (rounded up to a byte)."""
        return math.ceil(self.bytes_per_token * tokens)


# int4 with one fp16 scale and one fp16 zero point per 128 elements: 4 + 32 / 128 = 4.25 bits
# (KIVI-style group quantization); int2 likewise 2.25 bits.
_Q4 = 4.25
_Q2 = 2.25

MODELS: dict[str, KVModel] = {
    m.name: m
    for m in (
        KVModel("llama3-8b", 32, 8, 128, 16, 8.03e9, 32 * 128, "Llama-3-8B bf16: 128 KiB/token"),
        KVModel("llama3-8b-kv4", 32, 8, 128, _Q4, 8.03e9, 32 * 128, "Llama-3-8B, KV int4 + scales"),
        KVModel(
            "small",
            24,
            2,
            64,
            16,
            0.49e9,
            14 * 64,
            "24 layers x 2 KV heads x 64 bf16: 12 KiB/token",
        ),
        KVModel("small-kv4", 24, 2, 64, _Q4, 0.49e9, 14 * 64, "the small model, KV int4 + scales"),
        KVModel("small-kv2", 24, 2, 64, _Q2, 0.49e9, 14 * 64, "the small model, KV int2 + scales"),
    )
}


@dataclass(frozen=True)
class GpuSpec:
    """Prefill throughput of one GPU host.

    Prefill FLOPs for tokens ``[a, b)`` of a prompt: ``2 x params`` per token (the dense
    matmuls) plus attention, ``4 x layers x attn_dim x p`` for the token at position ``p`` (QK^T
    and AV against ``p`` earlier keys). Time = FLOPs / (peak x MFU).

    Attributes:
        name: label.
        peak_flops: dense bf16 peak (H100 SXM: 989 TFLOP/s, the datasheet figure).
        mfu: achieved fraction of peak in prefill (0.4: an assumption, typical of large-batch
            prefill in serving engines; the experiments print it).
    """

    name: str = "H100-SXM"
    peak_flops: float = 989e12
    mfu: float = 0.4

    def prefill_flops(self, model: KVModel, start: int, end: int) -> float:
        """FLOPs to prefill tokens ``[start, end)`` given the KV of ``[0, start)``."""
        n = max(0, end - start)
        positions = n * (start + end - 1) / 2
        return 2 * model.params * n + 4 * model.layers * model.attn_dim * positions

    def prefill_s(self, model: KVModel, start: int, end: int) -> float:
        """Seconds to prefill tokens ``[start, end)`` given the KV of ``[0, start)``."""
        return self.prefill_flops(model, start, end) / (self.peak_flops * self.mfu)


H100 = GpuSpec()


@dataclass(frozen=True)
class SwitchSpec:
    """The caching switch.

    Attributes:
        name: label.
        frag_bytes: bytes of value per packet pass (``FRAG_BYTES``).
        sram_bytes: fragment SRAM per pipe (``NUM_FRAG_SLOTS x FRAG_BYTES``).
        cache_entries: cache table entries (``CACHE_ENTRIES``).
        hot_miss_threshold: misses in one window before a digest (``HOT_MISS_THRESHOLD``).
        pipes: pipes; registers are per pipe, so a chunk is written to every pipe whose ports
            ask for it (the model writes all pipes: host GETs arrive on any uplink).
        pipe_pps: packets per second per pipe (Tofino: about one packet per clock at about
            1.2 GHz; an assumption, never the bottleneck in these runs).
        write_pps: WRITE packets per second through the CPU port (P4Runtime PacketOut over
            gRPC: about 10 us per message, an assumption; sets how long a chunk takes to load).
        table_write_s: latency of one P4Runtime table write (0.1 ms, an assumption).
        write_msg_bytes: control-channel bytes per WRITE beyond the frame (PacketOut metadata
            and gRPC framing, an estimate).
        table_msg_bytes: bytes of one P4Runtime table-write request (an estimate).
        digest_msg_bytes: bytes of one digest list with one entry (an estimate).
        group_msg_bytes: bytes of one multicast-group update (an estimate).
    """

    name: str
    frag_bytes: int
    sram_bytes: int
    cache_entries: int
    hot_miss_threshold: int
    pipes: int = 4
    pipe_pps: float = 1.2e9
    write_pps: float = 100e3
    table_write_s: float = 1e-4
    write_msg_bytes: int = 64
    table_msg_bytes: int = 100
    digest_msg_bytes: int = 64
    group_msg_bytes: int = 100

    def frags(self, nbytes: int) -> int:
        """Fragments of a chunk of ``nbytes``."""
        return -(-nbytes // self.frag_bytes)

    def load_s(self, nbytes: int) -> float:
        """Seconds to load one chunk into SRAM.

        WRITE every fragment to every pipe at ``write_pps``, plus two table writes (delete the
        old entry, insert the new one: the protocol's safe order).
        """
        return self.frags(nbytes) * self.pipes / self.write_pps + 2 * self.table_write_s

    def fits(self, nbytes: int) -> bool:
        """Whether a chunk of ``nbytes`` fits the SRAM of one pipe at all."""
        return nbytes <= self.sram_bytes


@functools.cache
def tofino1(sizes: Path | None = None) -> SwitchSpec:
    """The Tofino-1 switch: sizes.p4's ``__TARGET_TOFINO__`` branch (96 B fragments, 32,768 slots).

    Args:
        sizes: sizes.p4 (default: the repository's).

    Returns:
        The spec.

    Raises:
        kvcast.tools.gen_constants.GeneratorError: if the C preprocessor is missing.
    """
    from kvcast.tools.gen_constants import parse_sizes

    path = sizes or _REPO / "p4src" / "shared" / "sizes.p4"
    s = parse_sizes(path, path.parent.parent, "__TARGET_TOFINO__")
    return SwitchSpec(
        name="tofino1",
        frag_bytes=s["FRAG_BYTES"],
        sram_bytes=s["NUM_FRAG_SLOTS"] * s["FRAG_BYTES"],
        cache_entries=s["CACHE_ENTRIES"],
        hot_miss_threshold=s["HOT_MISS_THRESHOLD"],
    )


def bmv2() -> SwitchSpec:
    """The BMv2 target of the emulation (the generated constants), one pipe."""
    return SwitchSpec(
        name="bmv2",
        frag_bytes=c.FRAG_BYTES,
        sram_bytes=c.NUM_FRAG_SLOTS * c.FRAG_BYTES,
        cache_entries=c.CACHE_ENTRIES,
        hot_miss_threshold=c.HOT_MISS_THRESHOLD,
        pipes=1,
    )


@dataclass(frozen=True)
class WireFormat:
    """KVP framing on a link.

    Attributes:
        l2_bytes: per-frame bytes below IP: 38 on a real Ethernet link (14 header, 4 FCS, 8
            preamble, 12 inter-frame gap), 14 on an emulated veth shaped by tc (the header
            only, which is what tc counts).
        mtu: IP MTU; a pool DATA carries as many whole fragments as fit.
    """

    l2_bytes: int = 38
    mtu: int = 9000

    @property
    def l3_bytes(self) -> int:
        """IPv4 + UDP + KVP header bytes (from the generated constants)."""
        return c.IPV4_HDR_BYTES + c.UDP_HDR_BYTES + c.KVP_HDR_BYTES

    def frame(self, payload: int) -> int:
        """Bytes on the wire for one frame carrying ``payload`` bytes."""
        return self.l2_bytes + self.l3_bytes + payload

    def frags_per_data(self, frag_bytes: int) -> int:
        """Fragments in one pool DATA at this MTU (at least one)."""
        return max(1, (self.mtu - self.l3_bytes) // frag_bytes)

    def pool_coef(self, frag_bytes: int) -> float:
        """Wire bytes per payload byte for pool DATA (full frames)."""
        payload = self.frags_per_data(frag_bytes) * frag_bytes
        return self.frame(payload) / payload

    def sram_coef(self, frag_bytes: int) -> float:
        """Wire bytes per payload byte for switch-served DATA (one fragment per frame)."""
        return self.frame(frag_bytes) / frag_bytes

    def data_frames_bytes(self, nbytes: int, frag_bytes: int) -> int:
        """Wire bytes of the pool DATA frames that carry ``nbytes`` of one chunk."""
        per = self.frags_per_data(frag_bytes) * frag_bytes
        full, rest = divmod(nbytes, per)
        return full * self.frame(per) + (self.frame(rest) if rest else 0)
