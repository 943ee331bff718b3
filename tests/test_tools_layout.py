"""tools/ as scripts plus library modules (tools/README.md, "Layout"): a script (a module with an
`if __name__ == "__main__":` block, run as `python tools/NAME.py`) imports library modules only,
never another script; the modules import one another without a cycle; tools/README.md lists
every library module and every script, each in its own table. Read with `ast`: nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
SCRIPT_PREFIXES = ("bench_", "check_", "probe_", "profile_")  # a library module's name starts with none


def is_script(tree: ast.Module) -> bool:
    """Whether the module has a top-level `if __name__ == "__main__":` block."""
    return any(
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and isinstance(node.test.ops[0], ast.Eq)
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators)
        for node in tree.body
    )


def imported_names(tree: ast.Module) -> set[str]:
    """Top-level names of every absolute import in the module, function-local ones included."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def read_folder(folder: Path) -> tuple[set[str], dict[str, set[str]]]:
    """(the scripts, module -> the folder's modules it imports) of the folder's *.py."""
    trees = {path.stem: ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in sorted(folder.glob("*.py"))}
    scripts = {name for name, tree in trees.items() if is_script(tree)}
    return scripts, {name: imported_names(tree) & set(trees) - {name} for name, tree in trees.items()}


def script_imports(scripts: set[str], imports: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every script a that imports a script b, sorted."""
    return sorted(f"{a} -> {b}" for a in scripts for b in imports[a] & scripts)


def find_cycle(imports: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for dep in sorted(imports[name]):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        path.pop()
        state[name] = 2
        return None

    for name in sorted(imports):
        if name not in state and (cycle := visit(name)) is not None:
            return cycle
    return None


def readme_tables(text: str) -> tuple[set[str], set[str]]:
    """(library modules, scripts) that the README's Layout section lists: the `NAME.py` of the first
    column of the table after "Library modules:" and of the one after "Scripts"."""
    layout = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    library_part, script_part = layout.split("\nLibrary modules:", 1)[1].split("\nScripts", 1)

    def first_column(part: str) -> set[str]:
        rows = [line.split("|")[1] for line in part.splitlines() if line.startswith("| `")]
        return {m for cell in rows for m in re.findall(r"`(\w+)\.py`", cell)}

    return first_column(library_part), first_column(script_part)


@pytest.fixture(scope="module")
def tools() -> tuple[set[str], dict[str, set[str]]]:
    return read_folder(TOOLS)


def test_no_script_imports_another_script(tools):
    scripts, imports = tools
    assert script_imports(scripts, imports) == [], "move what scripts share into a library module"


def test_the_tools_modules_import_one_another_without_a_cycle(tools):
    assert find_cycle(tools[1]) is None


def test_the_readme_lists_every_script_and_every_library_module_in_its_table(tools):
    scripts, imports = tools
    library, listed_scripts = readme_tables((TOOLS / "README.md").read_text(encoding="utf-8"))
    assert listed_scripts == scripts
    assert library == set(imports) - scripts


def test_library_modules_are_not_named_as_scripts(tools):
    scripts, imports = tools
    assert sorted(m for m in set(imports) - scripts if m.startswith(SCRIPT_PREFIXES)) == []


def test_the_checks_find_a_script_importing_a_script_and_a_cycle(tmp_path):
    """The checks themselves, on a folder made for them: a library cycle lib_a -> lib_b -> lib_a (one
    of them through a function-local import) and a script run_a importing the script run_b."""
    main = 'if __name__ == "__main__":\n    pass\n'
    (tmp_path / "lib_a.py").write_text("import lib_b\nimport os\n")
    (tmp_path / "lib_b.py").write_text("def f():\n    from lib_a import x\n")
    (tmp_path / "run_a.py").write_text("from run_b import main\nimport lib_a\n" + main)
    (tmp_path / "run_b.py").write_text("import lib_b.sub\n" + main)
    (tmp_path / "run_c.py").write_text("if __name__ != '__main__':\n    pass\n")  # not a script's guard
    scripts, imports = read_folder(tmp_path)
    assert scripts == {"run_a", "run_b"}
    assert imports == {"lib_a": {"lib_b"}, "lib_b": {"lib_a"}, "run_a": {"run_b", "lib_a"}, "run_b": {"lib_b"}, "run_c": set()}
    assert script_imports(scripts, imports) == ["run_a -> run_b"]
    assert find_cycle(imports) == ["lib_a", "lib_b", "lib_a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_readme_tables_are_read_apart():
    text = (
        "# t\n\n## Layout\n\nLibrary modules:\n\n| module | x |\n|---|---|\n| `lib.py`, `lib2.py` | y |\n\n"
        "Scripts (all):\n\n| script | x |\n|---|---|\n| `run.py` | uses `lib.py` |\n\n## run.py\n\n| `other.py` | z |\n"
    )
    assert readme_tables(text) == ({"lib", "lib2"}, {"run"})
