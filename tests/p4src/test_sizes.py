"""sizes.p4 refuses size combinations that do not line up, on every target."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulation.targets import REPO
from kvcast.tools import gen_constants
from kvcast.tools.gen_constants import GeneratorError

SIZES = REPO / "p4src" / "shared" / "sizes.p4"
TARGETS = [None, "__TARGET_TOFINO__"]


@pytest.mark.parametrize("target", TARGETS)
def test_the_committed_sizes_agree(target: str | None) -> None:
    sizes = gen_constants.parse_sizes(SIZES, REPO / "p4src", target)
    assert sizes["FRAG_WORDS"] * sizes["WORD_BITS"] == sizes["FRAG_BYTES"] * 8
    assert 1 << sizes["SLOT_ADDR_BITS"] == sizes["NUM_FRAG_SLOTS"]


def _first_define(text: str, name: str) -> int:
    return text.index(f"#define {name} ")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("name", "factor", "message"),
    [
        ("FRAG_BYTES", 2, "FRAG_BYTES must be FRAG_WORDS words of WORD_BITS bits"),
        ("NUM_FRAG_SLOTS", 2, "NUM_FRAG_SLOTS must be 2^SLOT_ADDR_BITS"),
        ("POOL_BUCKETS", 2, "POOL_BUCKETS must be 2^POOL_BUCKET_BITS"),
    ],
)
def test_a_size_that_does_not_line_up_stops_the_preprocessor(
    tmp_path: Path, target: str | None, name: str, factor: int, message: str
) -> None:
    sizes = gen_constants.parse_sizes(SIZES, REPO / "p4src", target)
    text = SIZES.read_text()
    # Redefine the macro for the target under test: the Tofino branch comes first in the file.
    old = f"#define {name} {sizes[name]}\n"
    assert old in text
    start = text.index(old, _first_define(text, name) if target else text.index("#else"))
    broken = text[:start] + f"#define {name} {sizes[name] * factor}\n" + text[start + len(old) :]
    path = tmp_path / "sizes.p4"
    path.write_text(broken)
    with pytest.raises(GeneratorError, match=message.replace("^", r"\^")):
        gen_constants.parse_sizes(path, REPO / "p4src", target)
