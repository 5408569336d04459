"""Generator of ``kvcast/p4constants.py`` from the P4 source (``make constants``).

P4 is the single source of every opcode, port, size and P4Runtime name: this module reads
``p4src/shared/defines.p4`` (typed ``const`` declarations), the widths of the KVP header's
``bit<N>`` fields in ``p4src/shared/headers.p4``, the macros of
``p4src/shared/sizes.p4`` as the C preprocessor resolves them for a target, and the P4Info that
p4c produced, and writes one Python module. Nothing in Python re-types these values.

Functions:
    parse_defines: ``const bit<N> NAME = VALUE;`` declarations of a P4 file.
    parse_header_bits: the ``bit<N>`` field widths of one P4 header type.
    parse_sizes: the numeric macros of sizes.p4 for one target, via ``cpp -dM``.
    p4info_names: (kind, name, id) of every P4Info entity.
    render: the generated module's text.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from finsy.proto import p4i
from google.protobuf import text_format

_CONST_RE = re.compile(
    r"^\s*const\s+bit<(\d+)>\s+([A-Z][A-Z0-9_]*)\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*;", re.M
)
_DEFINE_RE = re.compile(r"^#define\s+([A-Z][A-Z0-9_]*)\s+\(?(0x[0-9a-fA-F]+|\d+)\)?\s*$", re.M)

# P4Info entity lists and the prefix their generated constants get.
_KINDS = (
    ("tables", "TABLE"),
    ("actions", "ACTION"),
    ("counters", "COUNTER"),
    ("direct_counters", "DIRECT_COUNTER"),
    ("registers", "REGISTER"),
    ("digests", "DIGEST"),
    ("controller_packet_metadata", "PACKET_METADATA"),
)


class GeneratorError(RuntimeError):
    """The P4 inputs cannot be turned into constants (missing file, name clash)."""


def parse_defines(text: str) -> dict[str, int]:
    """Returns the typed constants of a P4 file.

    Args:
        text: P4 source.

    Returns:
        Constant name to value, in source order.
    """
    return {name: int(value, 0) for _, name, value in _CONST_RE.findall(text)}


def parse_header_bits(text: str, header: str = "kvp_t") -> dict[str, int]:
    """Returns the widths of a header type's ``bit<N>`` fields, as ``KVP_<FIELD>_BITS`` names.

    Args:
        text: P4 source holding ``header <header> { ... }``.
        header: the header type's name.

    Returns:
        Constant name (prefix from the type name without ``_t``, upper-cased) to width in bits,
        in field order; fields of a typedef'd type are left out.

    Raises:
        GeneratorError: the header type is not in the text.
    """
    found = re.search(rf"^\s*header\s+{re.escape(header)}\s*\{{(.*?)\}}", text, re.M | re.S)
    if found is None:
        raise GeneratorError(f"header {header} not found")
    prefix = header.removesuffix("_t").upper()
    return {
        f"{prefix}_{name.upper()}_BITS": int(bits)
        for bits, name in re.findall(r"^\s*bit<(\d+)>\s+([a-z][a-z0-9_]*)\s*;", found[1], re.M)
    }


def parse_sizes(path: Path, include_dir: Path, target_macro: str | None = None) -> dict[str, int]:
    """Returns the numeric macros that sizes.p4 defines for one target.

    Args:
        path: sizes.p4.
        include_dir: the directory P4 includes are relative to (p4src).
        target_macro: a macro such as ``__TARGET_TOFINO__`` to define, or None for BMv2.

    Returns:
        Macro name to value, for macros whose value is a plain number.

    Raises:
        GeneratorError: the C preprocessor is missing or fails.
    """
    cmd = ["cpp", "-dM", "-undef", "-I", str(include_dir)]
    if target_macro:
        cmd.append(f"-D{target_macro}")
    cmd.append(str(path))
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    except OSError as exc:
        raise GeneratorError(f"cpp failed on {path}: {exc}") from exc
    except subprocess.CalledProcessError as exc:
        raise GeneratorError(f"cpp failed on {path}: {exc.stderr.strip()}") from exc
    return {
        name: int(value, 0) for name, value in _DEFINE_RE.findall(out) if not name.startswith("_")
    }


def load_p4info(path: Path) -> p4i.P4Info:
    """Parses a text-format P4Info file.

    Args:
        path: the ``.p4info.txtpb`` file.

    Returns:
        The P4Info message.

    Raises:
        GeneratorError: the file is missing.
    """
    if not path.exists():
        raise GeneratorError(f"{path} not found: run `make p4` where p4c-bm2-ss is installed")
    return text_format.Parse(path.read_text(), p4i.P4Info())


def p4info_names(p4info: p4i.P4Info) -> Iterable[tuple[str, str, int]]:
    """Yields (constant prefix, P4 name, id) for every named P4Info entity.

    Args:
        p4info: the program's P4Info.

    Yields:
        One triple per table, action, counter, direct counter, register, digest and packet
        metadata header.
    """
    for field, prefix in _KINDS:
        for entity in getattr(p4info, field):
            yield prefix, entity.preamble.name, entity.preamble.id


def _const_name(prefix: str, p4name: str, taken: set[str]) -> str:
    """Full dotted path, upper-cased, with the program prefix ``Kvcast`` dropped."""
    path = p4name.replace("Kvcast", "", 1) if p4name.startswith("Kvcast") else p4name
    name = f"{prefix}_{re.sub(r'[^A-Za-z0-9]+', '_', path).upper().strip('_')}"
    if name in taken:
        raise GeneratorError(f"two P4Info entities map to the constant {name}")
    return name


def render(
    defines: dict[str, int],
    sizes: dict[str, int],
    p4info: p4i.P4Info,
    sources: list[str],
    header_bits: dict[str, int] | None = None,
) -> str:
    """Renders the generated module.

    Args:
        defines: constants of defines.p4.
        header_bits: field widths of the KVP header (``parse_header_bits``), or None for none.
        sizes: macros of sizes.p4 for the target the P4Info was compiled for.
        p4info: the compiled program's P4Info.
        sources: input paths, named in the header.

    Returns:
        Python source text.
    """
    lines = [
        f'"""P4 constants for kvcast, generated from {", ".join(sources)}.',
        "",
        "Generated by `make constants` (kvcast.tools.gen_constants); do not edit.",
        '"""',
        "",
        "# ruff: noqa",
        "from typing import Final",
        "",
        "# --- p4src/shared/defines.p4",
    ]
    lines += [f"{name}: Final = {value}" for name, value in defines.items()]
    if header_bits:
        lines += ["", "# --- p4src/shared/headers.p4 (field widths of the KVP header)"]
        lines += [f"{name}: Final = {value}" for name, value in header_bits.items()]
    lines += ["", "# --- p4src/shared/sizes.p4 (this target)"]
    lines += [f"{name}: Final = {value}" for name, value in sorted(sizes.items())]
    lines += ["", "# --- P4Info names (P4Runtime identifies entities by these)"]
    taken: set[str] = set()
    ids: list[tuple[str, int]] = []
    for prefix, p4name, ident in p4info_names(p4info):
        const = _const_name(prefix, p4name, taken)
        taken.add(const)
        lines.append(f'{const}: Final = "{p4name}"')
        ids.append((p4name, ident))
    lines += [
        "",
        "# P4Info ids by name (informational: code looks entities up by name).",
        "P4INFO_IDS: Final[dict[str, int]] = {",
    ]
    lines += [f'    "{name}": {ident},' for name, ident in ids]
    lines += ["}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Command line entry point of ``make constants``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p4info", type=Path, required=True)
    ap.add_argument("--defines", type=Path, required=True)
    ap.add_argument("--sizes", type=Path, required=True)
    ap.add_argument("--headers", type=Path, default=None, help="headers.p4 (KVP field widths)")
    ap.add_argument("--include", type=Path, default=Path("p4src"))
    ap.add_argument("--target-macro", default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    text = render(
        parse_defines(args.defines.read_text()),
        parse_sizes(args.sizes, args.include, args.target_macro),
        load_p4info(args.p4info),
        [str(p) for p in (args.defines, args.headers, args.sizes, args.p4info) if p],
        parse_header_bits(args.headers.read_text()) if args.headers else None,
    )
    args.out.write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
