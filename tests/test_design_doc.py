"""docs/DESIGN.md names modules and folders by path: each one must exist, so that a rename or a
removal that forgets the design page fails here instead of leaving it stale."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
PATH = re.compile(r"\b((?:wicore|tests|tools|docs)/[\w/.-]*[\w/])")


def named_paths(text: str) -> set[str]:
    return {m.rstrip("/") for m in PATH.findall(text)}


def test_the_design_page_names_paths():
    names = named_paths(DESIGN.read_text())
    assert len(names) > 30  # it names the parts it describes
    assert {"wicore/engine/core.py", "wicore/blocks/policy.py", "wicore/graph/manifest.py"} <= names


def test_every_path_the_design_page_names_exists():
    missing = sorted(p for p in named_paths(DESIGN.read_text()) if not (ROOT / p).exists())
    assert missing == []


def test_the_check_catches_a_path_that_is_gone():
    assert named_paths("see wicore/nowhere/engine.py and wicore/engine/") == {"wicore/nowhere/engine.py", "wicore/engine"}
    assert not (ROOT / "wicore/nowhere/engine.py").exists()
