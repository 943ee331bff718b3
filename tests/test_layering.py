"""Packages import one way: import-linter's contracts in pyproject.toml hold, and break when an
import against them comes back.

import-linter analyses the package that `import wicore` finds, so each check runs in a
subprocess with PYTHONPATH set to the folder whose `wicore` is meant (the repository's, or a
copy with one import added), and with the repository's pyproject.toml as its config.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import wicore

PACKAGE = Path(wicore.__file__).parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"
CONTRACTS = [
    "packages import one way",
    "serving never imports the exporter (transformers, GGUF readers)",
    "the KV cache's books are integers: wicore.blocks imports nothing of WiCore",
]
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(root: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on the `wicore` package under `root` (it checks which one it found)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    found = subprocess.run(
        [sys.executable, "-c", "import wicore; print(wicore.__file__)"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(found.stdout.strip()) == root / "wicore" / "__init__.py"
    return subprocess.run(
        [sys.executable, "-c", LINT, "--config", str(config), "--no-cache", "--no-logo"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def verdicts(output: str) -> dict[str, str]:
    """Contract name -> KEPT / BROKEN, from import-linter's report."""
    found = {}
    for line in output.splitlines():
        for name in CONTRACTS:
            for verdict in ("KEPT", "BROKEN"):
                if line.strip() == f"{name} {verdict}":
                    found[name] = verdict
    return found


def test_the_package_keeps_its_import_contracts():
    result = lint_imports(PACKAGE.parent, PYPROJECT)
    assert verdicts(result.stdout) == {name: "KEPT" for name in CONTRACTS}, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout
    assert result.returncode == 0


@pytest.mark.parametrize(
    ("module", "added", "broken", "report"),
    [
        # A cycle back from the KV cache's stores to the engine that drives them.
        ("kv/tiers.py", "import wicore.engine", CONTRACTS[0], "wicore.kv is not allowed to import wicore.engine"),
        # The engine pulling in the exporter (transformers, GGUF readers).
        (
            "engine/engine.py",
            "import wicore.export.exporter",
            CONTRACTS[1],
            "wicore.engine is not allowed to import wicore.export",
        ),
        # The block books reaching for a model's description.
        ("blocks/block_pool.py", "import wicore.model", CONTRACTS[2], "wicore.blocks is not allowed to import wicore.model"),
    ],
)
def test_an_import_against_a_contract_is_caught(tmp_path, module, added, broken, report):
    copy = tmp_path / "wicore"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "pyproject.toml"
    shutil.copy(PYPROJECT, config)
    lines = (copy / module).read_text().splitlines()
    (copy / module).write_text("\n".join([*lines, f"{added}  # noqa: E402", ""]))
    result = lint_imports(tmp_path, config)
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdicts(result.stdout) == {name: "BROKEN" if name == broken else "KEPT" for name in CONTRACTS}
    assert report in result.stdout
    module_name = "wicore." + module.removesuffix(".py").replace("/", ".")
    target = added.split()[1]
    links = set(re.findall(r"^[-\s]+(\S+) -> (\S+) \(l\.(\d+)\)$", result.stdout, re.MULTILINE))
    # The only import of the target reported is the added line (a forbidden one also shows the chains reaching it).
    assert {link for link in links if link[1] == target} == {(module_name, target, str(len(lines) + 1))}
