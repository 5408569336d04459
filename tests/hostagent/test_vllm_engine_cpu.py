"""A real vLLM engine (the CPU build's model runner) loads its prefix layer by layer.

One engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the ``uni`` executor) with the
kvcast connector, a tiny random Llama (fp32) and a pool served by the real pool-node handler
behind a fake switch that can withhold fragments. The first request computes every token and
publishes its prompt blocks; after the engine's own prefix cache is dropped, the same prompt
comes back through the connector. Checked: the output equals the full computation's when the
prefix is loaded (pipelined per layer: the forward ran while layers arrived), and when one chunk
of the step stops after its first layer: the forward has run layer 0 with it, the chunk fails,
vLLM discards the step for that request and recomputes from that block, and the output is
still the full computation's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (scripts/setup.sh installs it)")
pytest.importorskip("transformers", reason="transformers not installed (writes the model)")

from hostagent.vllm_connector.worker import KvcastWorker, worker_sides  # noqa: E402
from kvcast import p4constants as c  # noqa: E402
from kvcast.backend import InMemoryBackend  # noqa: E402
from kvcast.wire import KvpHeader  # noqa: E402
from tests.hostagent.fakes import FakeServer, pool  # noqa: E402

pytestmark = pytest.mark.slow

BLOCK = 32
SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 512,
}
PROMPT = [(7 * i + 3) % 509 + 1 for i in range(4 * BLOCK + 5)]  # 4 full blocks and 5 tokens
TENANT = 4
BACKEND = InMemoryBackend()
ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def pool_backend(_extra: Any) -> InMemoryBackend:
    """The connector's pool client (``pool_backend`` names this factory): the test's pool."""
    return BACKEND


class Withholding:
    """The pool; for chunk ``key`` (when set) only its fragments below ``upto``.

    Each GET beyond ``upto`` for that chunk records the layer the engine's forward was
    waiting for when it came (``waiting``: -1 when none), so a test sees the forward go on
    past the layers the chunk holds while the chunk is still incomplete.
    """

    def __init__(self) -> None:
        self.inner = pool(BACKEND)
        self.key: int | None = None
        self.upto = 0
        self.waiting: list[int] = []

    def __call__(self, datagram: bytes) -> list[bytes]:
        hdr = KvpHeader.unpack(datagram)
        if self.key is None or hdr.key != self.key:
            return self.inner(datagram)
        if hdr.frag_idx >= self.upto:
            workers = worker_sides()
            job = workers[0]._sync_job if workers else None
            self.waiting.append(-1 if job is None else job.gate.waiting)
            return []
        count = min(hdr.frag_count, self.upto - hdr.frag_idx)
        return self.inner(datagram[:26] + count.to_bytes(2, "big") + datagram[28:])


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[FakeServer, Withholding]]:
    responder = Withholding()
    with FakeServer(responder) as srv:
        yield srv, responder


@pytest.fixture(scope="module")
def llm(
    tmp_path_factory: pytest.TempPathFactory, server: tuple[FakeServer, Withholding]
) -> Iterator[Any]:
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    from experiments.serving_engine import build_engine
    from experiments.serving_plan import make_model

    model = make_model(tmp_path_factory.mktemp("model") / "llama", SHAPE)
    host, port = server[0].address
    extra = {
        "service": f"{host}:{port}",
        "pool_backend": f"{__name__}:pool_backend",
        "tenant": TENANT,
        "host": "engine",
        "save_async": False,
        "fetch": {"timeout_s": 0.05, "max_timeout_s": 0.1, "max_retries": 2, "deadline_s": 2.0},
    }
    engine = build_engine(str(model), extra, max_model_len=1024, dtype="float32")
    yield engine
    del engine
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def worker() -> KvcastWorker:
    (side,) = worker_sides()
    return side


def generate(llm: Any) -> list[int]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=6, temperature=0.0)
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)], params, use_tqdm=False)
    return list(out.outputs[0].token_ids)


@pytest.fixture(scope="module")
def computed(llm: Any) -> list[int]:
    """The output of computing every token (the prompt's blocks are published meanwhile)."""
    tokens = generate(llm)
    assert len(worker().saved) == 4
    return tokens


def loaded_run(llm: Any) -> tuple[list[int], dict[str, float]]:
    """The prompt again, with the engine's own prefix cache dropped: through the connector."""
    assert llm.reset_prefix_cache()
    before = worker().counters.snapshot()
    tokens = generate(llm)
    after = worker().counters.snapshot()
    return tokens, {k: after.get(k, 0) - before.get(k, 0) for k in after}


def test_a_prefix_loaded_layer_by_layer_gives_the_computed_output(
    llm: Any, computed: list[int]
) -> None:
    tokens, delta = loaded_run(llm)
    assert tokens == computed
    assert delta["chunks_loaded"] == 4 and delta["chunks_failed"] == 0
    assert delta["load_steps"] >= 1
    step = worker().last_step
    assert set(step) == {"load_s", "forward_wait_s", "end_wait_s"}


def test_a_chunk_failing_after_its_first_layer_ran_is_recomputed_with_the_same_output(
    llm: Any, computed: list[int], server: tuple[FakeServer, Withholding]
) -> None:
    _, responder = server
    layout = worker().layout
    responder.key = worker().saved[2][1]  # the third block: its first layer only
    responder.upto = layout.layer_bytes // c.FRAG_BYTES
    responder.waiting.clear()
    try:
        tokens, delta = loaded_run(llm)
    finally:
        responder.key = None
    assert delta["chunks_failed"] == 1 and delta["blocks_failed"] == 2
    # The chunk's later layers were still asked for while the forward, past layer 0 (which
    # used the chunk's first layer), waited for layer 1: the chunk failed after that.
    assert 1 in responder.waiting
    assert tokens == computed
