"""Published operator lists of execution providers, kept as data (op_support/<ep>.json): what
`wicore doctor` consults for an EP that this ONNX Runtime does not have.

Each file names the list it was taken from (its address and version) and the day; it holds, for the
ops WiCore's exports use, the element types the EP's kernel takes. Three answers, never a guess:

    op listed, node's type among its types   -> taken
    op listed (or in `absent`), type not     -> not taken
    op not in the file, or no file for the EP -> unknown

A file: {"ep": ONNX Runtime's name, "source": address, "version", "taken": day, "absent": ["domain::Op",
...] looked for and not listed, "ops": {domain: {op: [element types, or "*" where the list names none]}}}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path

TABLES = Path(__file__).parent / "op_support"

ANY_TYPE = "*"  # a list that names ops without their types (CANN's graph mode)
# The input whose element type picks the kernel, where it is not the first (Where's is its condition).
TYPED_INPUT = {("ai.onnx", "Where"): 1}


class Support(Enum):
    TAKEN = "taken"
    NOT_TAKEN = "not taken"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class OpTable:
    """One EP's published list: (domain, op) -> the element types its kernel takes."""

    provider: str
    source: str
    version: str
    taken: str  # the day it was copied
    ops: dict[tuple[str, str], frozenset[str]]
    absent: frozenset[tuple[str, str]]  # looked for in the list and not there

    def support(self, domain: str, op_type: str, dtype: str | None) -> Support:
        key = (domain or "ai.onnx", op_type)
        if key in self.absent:
            return Support.NOT_TAKEN
        types = self.ops.get(key)
        if types is None:
            return Support.UNKNOWN
        return Support.TAKEN if dtype is None or ANY_TYPE in types or dtype in types else Support.NOT_TAKEN

    @property
    def citation(self) -> str:
        return f"{self.source} ({self.version}, taken {self.taken})"


@cache
def op_table(provider: str) -> OpTable | None:
    """The published list of `provider` (ONNX Runtime's name), or None where the repository holds none."""
    for path in sorted(TABLES.glob("*.json")):
        data = json.loads(path.read_text())
        if data["ep"] == provider:
            ops = {(domain, op): frozenset(types) for domain, table in data["ops"].items() for op, types in table.items()}
            absent = frozenset(tuple(entry.split("::", 1)) for entry in data.get("absent", ()))
            return OpTable(provider, data["source"], data["version"], data["taken"], ops, absent)
    return None
