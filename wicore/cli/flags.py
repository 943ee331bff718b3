"""Errors from the library name settings as the Python API spells them (`kv_pool_gb`,
`max_num_seqs`); the command line shows the flags a user of the command types instead. This is the
one place that maps them, for exactly the options the command that ran has."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable

_SETTING = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
# The engine settings `wicore serve` and `wicore generate` take as flags: what `wicore plan`'s
# advice names (it advises the serving command, whose options are not plan's own).
ENGINE_SETTINGS = ("kv_pool_gb", "max_num_seqs", "prefill_chunk", "max_context", "kv_offload_tokens", "host_tier_gb")


def as_flags(message: str, options: argparse.Namespace | Iterable[str]) -> str:
    """`message` with every setting that is one of `options` (a command's parsed arguments, or
    names) written as its flag: `kv_pool_gb 1.5` -> `--kv-pool-gb 1.5`."""
    names = set(vars(options)) if isinstance(options, argparse.Namespace) else set(options)
    return _SETTING.sub(lambda m: f"--{m.group(0).replace('_', '-')}" if m.group(0) in names else m.group(0), message)
