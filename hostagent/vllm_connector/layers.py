"""Per-layer release of a step's load: layer ``l`` of the forward waits for layer ``l`` only.

A chunk is layer-major (``hostagent.layout``): its first ``k`` layers are its first ``k x
layer_bytes`` bytes. The loader thread copies each chunk's layers into the engine's cache as
the fetch engine reports the verified prefix of the chunk growing (``FetchClient.fetch_many``'s
``progress``), and tells the gate how many layers of that chunk are settled. Layer ``l`` is
released once it is settled in every chunk of the step: copied from verified bytes, or the chunk
has failed (its blocks are then reported by ``get_block_ids_with_load_errors`` and vLLM discards
what the step computed for their requests and recomputes them, so a layer of a failed chunk may
be released uncopied).

Classes:
    LayerGate: the settled layers of each chunk of one step's load, and the waits on them.
"""

from __future__ import annotations

import threading

__all__ = ["LayerGate"]


class LayerGate:
    """How many layers of each chunk of one step's load are settled; waits for a layer.

    The loader thread calls ``settle`` and, at the end of the load, ``close``; the engine's
    thread calls ``wait``.

    Args:
        chunks: the chunks of the load.
        num_layers: layers per chunk.

    Raises:
        ValueError: ``num_layers`` is not positive or ``chunks`` is negative.
    """

    def __init__(self, chunks: int, num_layers: int) -> None:
        if num_layers < 1 or chunks < 0:
            raise ValueError(f"a gate needs num_layers >= 1 and chunks >= 0, got {num_layers}")
        self.num_layers = num_layers
        self._settled = [0] * chunks
        self._released = num_layers if chunks == 0 else 0
        self._closed = False
        self._waiting = -1
        self._cond = threading.Condition()

    @property
    def released(self) -> int:
        """Layers ``0 .. released - 1`` are settled in every chunk."""
        with self._cond:
            return self._released

    @property
    def closed(self) -> bool:
        """The load has ended (every layer released)."""
        with self._cond:
            return self._closed

    def settled(self, chunk: int) -> int:
        """How many layers of chunk ``chunk`` are settled."""
        with self._cond:
            return self._settled[chunk]

    def settle(self, chunk: int, layers: int) -> None:
        """Chunk ``chunk``'s first ``layers`` layers are settled (never fewer than before).

        Raises:
            IndexError: no such chunk.
            ValueError: ``layers`` is not in ``0 .. num_layers``.
        """
        if not 0 <= layers <= self.num_layers:
            raise ValueError(f"layers must be in 0..{self.num_layers}, got {layers}")
        with self._cond:
            if layers <= self._settled[chunk]:
                return
            self._settled[chunk] = layers
            released = min(self._settled)
            if released > self._released:
                self._released = released
                self._cond.notify_all()

    def close(self) -> None:
        """The load has ended: every layer is released (what failed is reported apart)."""
        with self._cond:
            self._closed = True
            self._released = self.num_layers
            self._cond.notify_all()

    def wait(self, layer: int, timeout_s: float | None = None) -> bool:
        """Waits until layer ``layer`` is released (or the load ended).

        Args:
            layer: the layer's index (a layer beyond the last waits for the whole load).
            timeout_s: the most to wait; None: until released.

        Returns:
            Whether it was released within ``timeout_s``.
        """
        with self._cond:
            self._waiting = layer
            try:
                return self._cond.wait_for(
                    lambda: self._released > layer or self._closed, timeout=timeout_s
                )
            finally:
                self._waiting = -1

    @property
    def waiting(self) -> int:
        """The layer a ``wait`` is blocked on now (-1: none): how far the forward has got."""
        with self._cond:
            return self._waiting
