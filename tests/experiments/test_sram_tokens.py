"""The SRAM budget in tokens of real model shapes, and Q1 at that budget."""

from __future__ import annotations

import pytest

from experiments import sram_tokens as st

MIB3 = 3 << 20


@pytest.mark.parametrize(
    ("name", "per_token", "fit"),
    [
        ("Llama-3-8B", 128 << 10, (24, 1)),
        ("Llama-3.2-1B", 32 << 10, (96, 6)),
        ("Qwen2.5-0.5B", 12 << 10, (256, 16)),
        ("DeepSeek-V2-Lite", 27 * 576 * 2, (101, 6)),
    ],
)
def test_kv_bytes_per_token_and_what_3_mib_holds(
    name: str, per_token: int, fit: tuple[int, int]
) -> None:
    (model,) = [m for m in st.MODELS if m.name == name]
    assert st.kv_bytes_per_token(model) == per_token
    assert st.tokens_that_fit(MIB3, model) == fit


def test_served_tokens_by_each_selection_on_a_hand_example() -> None:
    # First blocks 7, 7, 9, 9, 9, 7: 9 is the most frequent in hindsight.
    requests = [(7, 100), (7, 40), (9, 100), (9, 100), (9, 100), (7, 100)]
    got = st.served_tokens(requests, 64)
    assert got["static-best"] == 3 * 64
    assert got["lru"] == 40 + 64 + 64  # held 7 for the 2nd, 9 for the 4th and 5th
    assert got["lfu"] == 40  # 7 until 9 is seen more often (after the 5th)
    assert got["prompt"] == 540


def test_main_prints_a_line_per_model_and_selection(capsys: pytest.CaptureFixture[str]) -> None:
    assert st.main(["--limit", "50"]) == 0
    out = capsys.readouterr().out
    assert out.count("result sram-tokens ") == len(st.MODELS)
    assert "selection=static-best" in out and "blocks512=0" in out
