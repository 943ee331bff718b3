"""Split a model's layers over N ONNX files."""

from __future__ import annotations

from dataclasses import dataclass

from wicore.errors import WiCoreError


@dataclass(frozen=True)
class PartitionSpec:
    """Which part of the model one ONNX file holds."""

    index: int
    start: int  # first layer
    stop: int  # one past the last layer
    has_embedding: bool
    has_lm_head: bool

    @property
    def file_name(self) -> str:
        return f"part-{self.index:02d}.onnx"


def plan_partitions(num_layers: int, num_partitions: int) -> list[PartitionSpec]:
    """Contiguous layer ranges, sizes differing by at most one; the extra layers go to the
    middle partitions, since the first and last also carry the embedding and the LM head.

    >>> [(p.start, p.stop) for p in plan_partitions(18, 3)]
    [(0, 6), (6, 12), (12, 18)]
    """
    if not 1 <= num_partitions <= num_layers:
        raise WiCoreError(f"--partitions must be between 1 and the number of layers ({num_layers}), got {num_partitions}")
    base, extra = divmod(num_layers, num_partitions)
    # Partitions that get one more layer: the middle ones first.
    order = sorted(range(num_partitions), key=lambda i: (i in (0, num_partitions - 1), abs(i - (num_partitions - 1) / 2)))
    bigger = set(order[:extra])
    specs, start = [], 0
    for i in range(num_partitions):
        stop = start + base + (i in bigger)
        specs.append(PartitionSpec(i, start, stop, has_embedding=i == 0, has_lm_head=i == num_partitions - 1))
        start = stop
    return specs
