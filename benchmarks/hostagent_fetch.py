"""Host agent fetch goodput into a tensor (hostagent.bench)."""

from hostagent.bench import run

__all__ = ["run"]
