"""p4testgen's PTF tests for the Tofino target, read as data.

p4testgen (p4c's test generator, ``--target tofino --arch tna --test-backend ptf``) writes one
Python file of PTF test classes for bf_switchd. Each class installs table entries, overrides
default actions and sets register cells (``setupCtrlPlane``), sends one packet on a port
(``sendPacket``) and expects one packet on a port with don't-care bit ranges, or none
(``verifyPackets``: nothing there means the packet is dropped). The PTF back end, not the STF
one, because only PTF tests give registers initial values: with STF, p4testgen treats every
register read as unknown, so a GET hit (which reads the slot's epoch) cannot be generated.

The file is parsed with :mod:`ast`, never imported or run, and only the statement shapes of
p4testgen's template are accepted: anything else is an error naming the line, so that a change
of the template is noticed rather than half-read.

Classes:
    KeyField: one key field of an entry (exact value, LPM prefix, ternary mask or range).
    TableEntry: an entry to insert, or a default action to set (``key`` is None).
    RegisterCell: a register cell's initial value (a word, or named fields of a struct).
    Expected: the packet expected out, with the bits that may differ.
    TestgenCase: one generated test.
    PtfFormatError: the file does not have the template's shape.

Functions:
    parse_ptf: every test of one PTF file.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field


class PtfFormatError(ValueError):
    """The PTF file has a statement that p4testgen's template does not write."""


@dataclass(frozen=True)
class KeyField:
    """One key field of a table entry, as p4testgen names it.

    Attributes:
        name: the key's control-plane name (the P4Info match field name).
        value: the value (the low bound for a range).
        mask: the ternary mask, or None.
        prefix_len: the LPM prefix length, or None.
        high: the high bound of a range, or None.
    """

    name: str
    value: int
    mask: int | None = None
    prefix_len: int | None = None
    high: int | None = None


@dataclass(frozen=True)
class TableEntry:
    """An entry p4testgen installs, or a default action it sets.

    Attributes:
        table: the table's control-plane name.
        key: the key fields, or None for a default action.
        action: the action's control-plane name.
        params: action parameter name -> value.
    """

    table: str
    key: tuple[KeyField, ...] | None
    action: str
    params: dict[str, int]


@dataclass(frozen=True)
class RegisterCell:
    """A register cell's value before the packet.

    Attributes:
        register: the register's control-plane name.
        index: the cell.
        value: the cell's value (a plain register).
        fields: field name -> value (a register of a struct; ``value`` is then 0).
    """

    register: str
    index: int
    value: int = 0
    fields: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Expected:
    """The packet p4testgen expects out.

    Attributes:
        port: the egress port.
        frame: the bytes.
        ignore: (first bit, bit count) ranges whose value is not checked.
    """

    port: int
    frame: bytes
    ignore: tuple[tuple[int, int], ...] = ()

    def care_mask(self) -> bytes:
        """One mask byte per frame byte: 1 bits are checked, 0 bits are not."""
        mask = bytearray(b"\xff" * len(self.frame))
        for first, count in self.ignore:
            for bit in range(first, first + count):
                if bit // 8 < len(mask):
                    mask[bit // 8] &= ~(0x80 >> (bit % 8)) & 0xFF
        return bytes(mask)


@dataclass(frozen=True)
class TestgenCase:
    """One generated test.

    Attributes:
        name: the test class name (``Test<n>``).
        entries: table entries and default actions, in the order written.
        registers: register cells set before the packet.
        port: the ingress port.
        frame: the packet sent (for the CPU port, starting with the packet_out header).
        expected: the packet expected out, or None for a drop.
    """

    __test__ = False  # not a pytest class

    name: str
    entries: tuple[TableEntry, ...]
    registers: tuple[RegisterCell, ...]
    port: int
    frame: bytes
    expected: Expected | None


def _int(node: ast.expr, where: str) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    raise PtfFormatError(f"line {node.lineno}: {where}: expected an integer")


def _str(node: ast.expr, where: str) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    raise PtfFormatError(f"line {node.lineno}: {where}: expected a string")


def _call_name(node: ast.expr) -> str:
    """``self.f`` -> ``f``, ``gc.KeyTuple`` -> ``KeyTuple``, ``f`` -> ``f``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _list(node: ast.expr, where: str) -> list[ast.expr]:
    if isinstance(node, ast.List | ast.Tuple):
        return list(node.elts)
    raise PtfFormatError(f"line {node.lineno}: {where}: expected a list")


def _key_field(node: ast.expr) -> KeyField:
    if not isinstance(node, ast.Call) or _call_name(node) != "KeyTuple":
        raise PtfFormatError(f"line {node.lineno}: expected gc.KeyTuple(...)")
    name = _str(node.args[0], "key field name")
    kw = {k.arg: _int(k.value, f"key field {name}") for k in node.keywords}
    if "low" in kw:
        return KeyField(name, kw["low"], high=kw["high"])
    value = _int(node.args[1], f"key field {name}")
    if "prefix_len" in kw:
        return KeyField(name, value, prefix_len=kw["prefix_len"])
    if len(node.args) == 3:
        return KeyField(name, value, mask=_int(node.args[2], f"key field {name} mask"))
    return KeyField(name, value)


def _params(node: ast.expr, where: str) -> dict[str, int]:
    params = {}
    for item in _list(node, where):
        if not isinstance(item, ast.Call) or _call_name(item) != "DataTuple":
            raise PtfFormatError(f"line {item.lineno}: {where}: expected gc.DataTuple(...)")
        params[_str(item.args[0], where)] = _int(item.args[1], where)
    return params


def _control_plane(
    body: list[ast.stmt],
) -> tuple[list[TableEntry], list[RegisterCell]]:
    entries: list[TableEntry] = []
    registers: list[RegisterCell] = []
    for stmt in body:
        if isinstance(stmt, ast.Pass):
            continue
        if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
            raise PtfFormatError(
                f"line {stmt.lineno}: setupCtrlPlane: statement not written by the template "
                "(a register parameter or an action profile, which kvcast does not use?)"
            )
        call, what = stmt.value, _call_name(stmt.value)
        args = call.args
        if what == "insertTableEntry":
            table = _str(args[0], what)
            if isinstance(args[2], ast.Constant) and args[2].value is None:
                raise PtfFormatError(f"line {stmt.lineno}: action profile member in {table}")
            key = tuple(_key_field(k) for k in _list(args[1], what))
            entries.append(TableEntry(table, key, _str(args[2], what), _params(args[3], what)))
        elif what == "overrideDefaultEntry":
            table = _str(args[0], what)
            entries.append(TableEntry(table, None, _str(args[1], what), _params(args[2], what)))
        elif what == "setRegisterValue":
            name, index = _str(args[0], what), _int(args[2], what)
            if isinstance(args[1], ast.List):
                fields = {}
                for pair in _list(args[1], what):
                    k, v = _list(pair, what)
                    fields[_str(k, what)] = _int(v, what)
                registers.append(RegisterCell(name, index, fields=fields))
            else:
                registers.append(RegisterCell(name, index, value=_int(args[1], what)))
        else:
            raise PtfFormatError(f"line {stmt.lineno}: setupCtrlPlane: unknown call {what}")
    return entries, registers


def _assigned(body: list[ast.stmt]) -> dict[str, ast.expr]:
    """name -> the last value assigned to it in a method body (``x = ...`` statements)."""
    out = {}
    for stmt in body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            out[stmt.targets[0].id] = stmt.value
    return out


def _bytes(node: ast.expr, where: str) -> bytes:
    if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
        return node.value
    raise PtfFormatError(f"line {node.lineno}: {where}: expected a bytes literal")


def _expected(body: list[ast.stmt]) -> Expected | None:
    values = _assigned(body)
    if "eg_port" not in values:
        return None
    ignore = []
    for stmt in body:
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and _call_name(stmt.value) == "set_do_not_care"
        ):
            first, count = (_int(a, "set_do_not_care") for a in stmt.value.args)
            ignore.append((first, count))
    frame = _bytes(_first_bytes(body, "exp_pkt"), "exp_pkt")
    return Expected(_int(values["eg_port"], "eg_port"), frame, tuple(ignore))


def _first_bytes(body: list[ast.stmt], name: str) -> ast.expr:
    """The bytes literal first assigned to ``name`` (``exp_pkt`` is then wrapped in a Mask)."""
    for stmt in body:
        if (
            isinstance(stmt, ast.Assign)
            and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == name
            and isinstance(stmt.value, ast.Constant)
        ):
            return stmt.value
    raise PtfFormatError(f"no bytes literal assigned to {name}")


def parse_ptf(text: str) -> list[TestgenCase]:
    """Every test of one PTF file that p4testgen wrote for the Tofino target.

    Args:
        text: the file's contents.

    Returns:
        The tests in file order.

    Raises:
        PtfFormatError: a test has a statement p4testgen's template does not write, or lacks
            a packet to send.
        SyntaxError: the file is not Python.
    """
    cases = []
    for node in ast.parse(text).body:
        if not isinstance(node, ast.ClassDef) or node.name == "AbstractTest":
            continue
        methods = {f.name: f.body for f in node.body if isinstance(f, ast.FunctionDef)}
        if "sendPacket" not in methods:
            continue
        entries, registers = _control_plane(methods.get("setupCtrlPlane", []))
        sent = _assigned(methods["sendPacket"])
        if "ig_port" not in sent or "pkt" not in sent:
            raise PtfFormatError(f"{node.name}: sendPacket sends no packet")
        cases.append(
            TestgenCase(
                name=node.name,
                entries=tuple(entries),
                registers=tuple(registers),
                port=_int(sent["ig_port"], "ig_port"),
                frame=_bytes(sent["pkt"], "pkt"),
                expected=_expected(methods.get("verifyPackets", [])),
            )
        )
    return cases
