"""How much memory a device can still give: the readers the capability table names (free_bytes).
None where it is unknown: placement then asks for a budget."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def host_free_bytes(_: str, proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Memory the host can give without swapping: MemAvailable, within the cgroup's limit.

    Not MemFree: page cache (the exported model just written, say) is reclaimable, and a
    machine that has written a few GB holds most of its memory as cache.
    """
    available = _meminfo_kib(proc / "meminfo", "MemAvailable")
    if available is None:
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    free = available << 10
    v1 = ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")
    for limit, usage in (("memory.max", "memory.current"), v1):
        room = _cgroup_room(cgroup / limit, cgroup / usage)
        if room is not None:
            return min(free, room)
    return free


def _meminfo_kib(path: Path, field: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == field:
                return int(value.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room(limit_file: Path, usage_file: Path) -> int | None:
    """limit - usage of a memory cgroup, None without a limit ("max", or v1's huge sentinel)."""
    try:
        limit, usage = limit_file.read_text().strip(), int(usage_file.read_text())
    except (OSError, ValueError):
        return None
    if not limit.isdigit() or int(limit) >= 1 << 60:
        return None
    return max(0, int(limit) - usage)


def nvidia_free_bytes(index: str) -> int | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", index],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return int(out.strip().splitlines()[0]) << 20
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


def unknown_free_bytes(_: str) -> int | None:
    return None
