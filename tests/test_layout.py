"""The shape of the repository: one installed package, no import cycles, no sys.path edits but
the commands' one bootstrap line.

These read the source as text (ast), so they hold for every module, including ones whose
dependencies (triton, transformers) a machine may lack.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "spheretnorm"
# Where the project's Python lives: the package and the commands around it.
SOURCE_DIRS = (PACKAGE, "scripts", "eval", "data", "config", "tests")
TOP_LEVEL_COMMANDS = ("train.py", "sample.py", "bench.py")
COMMAND_FOLDERS = ("scripts", "eval", "data")
MAX_CLASS_LINES = 250
MAX_TRAIN_LINES = 600


def project_files() -> list[Path]:
    files = [REPO / name for name in TOP_LEVEL_COMMANDS]
    for folder in SOURCE_DIRS:
        files += sorted((REPO / folder).rglob("*.py"))
    return [f for f in files if f.is_file()]


def module_name(path: Path) -> str:
    """spheretnorm/hf/folder.py -> spheretnorm.hf.folder; spheretnorm/__init__.py -> spheretnorm."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in (REPO / PACKAGE).rglob("*.py")}


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `path` imports anywhere in it (also inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import sub` imports the submodule pkg.sub when there is one.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in modules and name != here)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles_in_the_package() -> None:
    modules = package_modules()
    graph = {name: imported_modules(path, modules) for name, path in modules.items()}
    assert graph["spheretnorm.model"], "the import scan found nothing: it is broken"
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


SYS_PATH_EDIT = re.compile(r"\bsys\.path\s*(\.\s*(insert|append|extend|remove|pop|clear)\b|\[[^\]]*\]\s*=|\s*[+]?=(?!=))")


def test_the_sys_path_pattern_matches_edits_only() -> None:
    for edit in ("sys.path.insert(0, x)", "sys.path[0] = x", "sys.path.append(x)", "sys.path = [x]", "sys.path += [x]"):
        assert SYS_PATH_EDIT.search(edit), edit
    assert not SYS_PATH_EDIT.search("print(sys.path)")
    assert not SYS_PATH_EDIT.search("if sys.path == []:")


# The one sys.path edit: a command of scripts/, eval/ or data/ puts its own clone first, so that it
# runs from a clone without `pip install` (docs/ARCHITECTURE.md, "The commands").
BOOTSTRAP = "sys.path.insert(0, str(Path(__file__).resolve().parents[1]))"


def command_files() -> list[Path]:
    """Every command a user runs: the top-level ones and every module of scripts/, eval/, data/."""
    files = [REPO / name for name in TOP_LEVEL_COMMANDS]
    for folder in COMMAND_FOLDERS:
        files += sorted(p for p in (REPO / folder).glob("*.py") if p.name != "__init__.py")
    return files


def is_bootstrap(path: Path, line: str) -> bool:
    return path.parent.name in COMMAND_FOLDERS and path.parent.parent == REPO and line.split("#")[0].strip() == BOOTSTRAP


def test_no_file_edits_sys_path_but_the_commands_bootstrap() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in project_files()
        if path.name != "test_layout.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if SYS_PATH_EDIT.search(line) and not is_bootstrap(path, line)
    ]
    assert not offenders, f"sys.path edits (the package is found by the commands' bootstrap line, {BOOTSTRAP!r}): {offenders}"
    assert is_bootstrap(REPO / "scripts" / "tables.py", BOOTSTRAP + "  # why")
    assert not is_bootstrap(REPO / PACKAGE / "model.py", BOOTSTRAP)


def test_every_command_in_a_folder_bootstraps_before_its_first_package_import() -> None:
    """Run as a file, a command of scripts/ finds its folder, not the clone: without the line, the
    package must be installed (and an installed copy elsewhere would win over the clone's)."""
    missing = []
    for path in command_files():
        if path.parent == REPO:
            continue  # python train.py: the clone is the script's folder, first on sys.path already
        lines = path.read_text(encoding="utf-8").splitlines()
        first_import = next((i for i, line in enumerate(lines) if re.match(r"(from|import) spheretnorm\b", line)), len(lines))
        if not any(is_bootstrap(path, line) for line in lines[:first_import]):
            missing.append(str(path.relative_to(REPO)))
    assert not missing, f"commands without the line {BOOTSTRAP!r} before their first import of spheretnorm: {missing}"


def test_one_installed_import_name(tmp_path: Path) -> None:
    """A wheel of the project holds one top-level package, spheretnorm, and no loose modules."""
    build = REPO / "build"
    had_build = build.exists()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
            capture_output=True, text=True,
        )
    finally:
        if not had_build:  # setuptools builds in the checkout: leave it as it was
            shutil.rmtree(build, ignore_errors=True)
    if result.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {result.stderr.strip().splitlines()[-1:]}")
    import zipfile

    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {PACKAGE}, top
    assert f"{PACKAGE}/hf/remote/modeling_spheretnorm.py" in names  # the export's templates travel


def test_no_class_is_longer_than_250_lines() -> None:
    long = []
    for path in project_files():
        if path.parts[len(REPO.parts)] == "tests":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                long.append(f"{path.relative_to(REPO)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


def test_train_py_is_the_entry_point_and_the_loop() -> None:
    assert len((REPO / "train.py").read_text(encoding="utf-8").splitlines()) <= MAX_TRAIN_LINES
    importers = [
        str(path.relative_to(REPO))
        for path in project_files()
        if path.parts[len(REPO.parts)] != "tests"
        and re.search(r"^\s*(import train\b|from train import)", path.read_text(encoding="utf-8"), re.M)
    ]
    assert not importers, f"these import train.py as a library: {importers}"


def test_docstrings_point_inside_the_repository() -> None:
    """The maths lives in docs/, which a user's clone has; ../shared does not travel."""
    offenders = [
        str(path.relative_to(REPO))
        for path in project_files()
        if path.name != "test_layout.py" and "shared/spec" in path.read_text(encoding="utf-8")
    ]
    assert not offenders, offenders
    assert (REPO / "docs" / "CONNECTIONS.md").is_file()


def test_commands_import_the_package_not_each_other() -> None:
    """A command's shared logic lives in spheretnorm/: scripts/, eval/ and data/ import none of
    their neighbours (their bootstrap line puts the clone on sys.path for the package only)."""
    offenders = []
    for folder in ("scripts", "eval", "data"):
        for path in (REPO / folder).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                if any(n.split(".")[0] in ("scripts", "eval", "data", "train", "bench", "sample") for n in names):
                    offenders.append(f"{path.relative_to(REPO)} imports {names}")
    assert not offenders, offenders


def test_readme_names_every_top_level_entry() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    entries = {line.split("/")[0] for line in tracked.stdout.splitlines()} - {".gitignore", "README.md"}
    section = (REPO / "README.md").read_text(encoding="utf-8").split("## What is where", 1)[1].split("\n## ", 1)[0]
    missing = sorted(e for e in entries if f"`{e}" not in section)
    assert not missing, f"README's 'What is where' does not name {missing}"


# The package's layers, lowest first. A module may import its own layer and the ones below,
# never one above: the model core knows nothing of training, training nothing of the
# integrations (data preparation, zero-shot evaluation, Hugging Face), and nothing imports the
# experiment tooling. A module found in no layer fails the test: a new one must choose.
LAYERS = {
    "core": ("spheretnorm", "spheretnorm.model", "spheretnorm.keys", "spheretnorm.retractions", "spheretnorm.kernels", "spheretnorm.chunked_loss",
             "spheretnorm.triton_kernels", "spheretnorm.mup", "spheretnorm.diagnostics", "spheretnorm.optim"),
    "runtime": ("spheretnorm.runtime",),
    "integrations": ("spheretnorm.data", "spheretnorm.zeroshot", "spheretnorm.hf"),
    "experiments": ("spheretnorm.experiments", "spheretnorm.cluster"),  # cluster: the grid's launcher
}
# What model.py may import: the standard library, torch, and the core modules an export copies.
MODEL_IMPORTS = {"torch", "spheretnorm.keys", "spheretnorm.kernels", "spheretnorm.mup", "spheretnorm.retractions", "spheretnorm.chunked_loss"}


def layer_of(module: str) -> int | None:
    """The rank of a package module's layer (0 = core), by the longest matching prefix."""
    best: tuple[int, int] | None = None
    for rank, prefixes in enumerate(LAYERS.values()):
        for prefix in prefixes:
            core_exact = rank == 0  # core lists modules, not packages: spheretnorm.x is not core by prefix
            if module == prefix or (not core_exact and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (rank, len(prefix))
    return None if best is None else best[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    names = list(LAYERS)
    out = []
    for module, imported in sorted(graph.items()):
        for other in sorted(imported):
            if layer_of(other) > layer_of(module):
                out.append(f"{module} ({names[layer_of(module)]}) imports {other} ({names[layer_of(other)]})")
    return out


def test_the_layer_check_finds_an_upward_import() -> None:
    assert layer_of("spheretnorm.model") == 0 and layer_of("spheretnorm.runtime.config") == 1
    assert layer_of("spheretnorm.hf.remote.modeling_spheretnorm") == 2 and layer_of("spheretnorm.experiments.grid") == 3
    assert layer_of("spheretnorm.newthing") is None
    assert upward_imports({"spheretnorm.model": {"spheretnorm.runtime.checkpoint"}}) == [
        "spheretnorm.model (core) imports spheretnorm.runtime.checkpoint (runtime)"
    ]
    assert upward_imports({"spheretnorm.experiments.grid": {"spheretnorm.model", "spheretnorm.hf.folder"}}) == []


def test_every_module_has_a_layer_and_imports_go_one_way() -> None:
    modules = package_modules()
    homeless = sorted(m for m in modules if layer_of(m) is None)
    assert not homeless, f"modules in no layer of tests/test_layout.py's LAYERS: {homeless}"
    graph = {name: imported_modules(path, modules) for name, path in modules.items()}
    assert graph["spheretnorm.runtime.checkpoint"], "the import scan found nothing: it is broken"
    bad = upward_imports(graph)
    assert not bad, "imports against the layers (core <- runtime <- integrations <- experiments): " + "; ".join(bad)


def test_model_py_imports_only_torch_the_standard_library_and_the_core() -> None:
    tree = ast.parse((REPO / PACKAGE / "model.py").read_text(encoding="utf-8"))
    here = "spheretnorm"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found.add(f"{here}.{base}" if node.level else base)
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    foreign = sorted(n for n in found if n.split(".")[0] not in allowed and n != "torch" and not n.startswith("torch.")
                     and n not in MODEL_IMPORTS)
    assert not foreign, f"model.py imports {foreign}; it may import torch, the standard library and {sorted(MODEL_IMPORTS)}"
    assert any(n.startswith("spheretnorm.") for n in found), "the scan missed model.py's relative imports"


# -----------------------------------------------------------------------------
# One rule for commands: a command in scripts/, eval/ or data/ is a thin entry (parse, call the
# library) or owns its logic, and in both cases nothing imports it, tests included: what a test
# or a second command needs lives in the package. And every Python file name says which file it
# is: no two files share one (__init__.py and conftest.py aside).

# What older commits wrote, with the script that wrote it (run against that commit's checkout,
# whose commands it imports): data, not the project's source. An exported Hugging Face folder must
# call its code modeling_spheretnorm.py and configuration_spheretnorm.py, as config.json names them.
FIXTURES = Path("tests") / "data"
SHARED_FILE_NAMES = ("__init__.py", "conftest.py")


def is_fixture(path: Path) -> bool:
    return (REPO / path if not path.is_absolute() else path).is_relative_to(REPO / FIXTURES)


def command_imports(source: str) -> list[str]:
    """The imports in `source` of a module of scripts/, eval/ or data/ (`import scripts.launch`,
    `from eval import zero_shot`, `from data.prepare import main`, importlib.import_module("scripts.x"))."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""  # from scripts import launch: the module scripts.launch
            names = [f"{module}.{alias.name}" for alias in node.names] if "." not in module else [module]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) in ("import_module", "__import__"))):
            names = [node.args[0].value]
        else:
            continue
        found += [f"{name} (line {node.lineno})" for name in names if name.split(".")[0] in COMMAND_FOLDERS]
    return found


def test_the_command_import_scan_finds_every_form() -> None:
    for line in ("import scripts.launch", "from scripts import launch", "from scripts.coord_check import Setup",
                 "from eval import zero_shot", "import eval.lm_eval_cli as cli", "from data.prepare import main",
                 "def f():\n    from scripts import export_hf", "importlib.import_module('scripts.launch')",
                 "__import__('eval.zero_shot')"):
        assert command_imports(line), line
    for line in ("from spheretnorm.experiments import launcher", "from spheretnorm.data import tokenizer",
                 "from .data import x", "import spheretnorm.zeroshot.driver", "from markov_data import VOCAB",
                 "import_module('spheretnorm.hf.export_cli')"):
        assert not command_imports(line), line


def test_no_file_imports_a_command() -> None:
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in project_files()
        if not is_fixture(path)
        for name in command_imports(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, (
        "a command of scripts/, eval/ or data/ is imported by nobody: move what is needed into the "
        f"package (spheretnorm/experiments/, ...) and import it from there: {offenders}"
    )


def python_files() -> list[Path]:
    """Every .py file of the checkout, relative to it: git's tracked and untracked-but-not-ignored
    files (so a new file counts before its commit); outside a git checkout, the project's files."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.py"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:
        return [p.relative_to(REPO) for p in project_files()]
    return [Path(line) for line in listed.stdout.splitlines() if (REPO / line).is_file()]


def duplicate_names(paths: list[Path]) -> dict[str, list[str]]:
    """{file name: its paths} for every .py name that two files share (__init__.py, conftest.py aside)."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        if path.name not in SHARED_FILE_NAMES:
            by_name.setdefault(path.name, []).append(str(path))
    return {name: sorted(where) for name, where in sorted(by_name.items()) if len(where) > 1}


def test_the_duplicate_finder_finds_a_shared_name() -> None:
    paths = [Path("scripts/launch.py"), Path("spheretnorm/experiments/launch.py"), Path("a/__init__.py"), Path("b/__init__.py"),
             Path("tests/conftest.py"), Path("x/conftest.py"), Path("spheretnorm/experiments/launcher.py")]
    assert duplicate_names(paths) == {"launch.py": ["scripts/launch.py", "spheretnorm/experiments/launch.py"]}


def test_every_python_file_name_is_unique() -> None:
    files = [path for path in python_files() if not is_fixture(path)]
    assert Path("spheretnorm/model.py") in files and Path("tests/test_layout.py") in files, "the file listing is broken"
    shared = duplicate_names(files)
    assert not shared, f"file names shared by several files (give each its own name): {shared}"


IN_PLACE_ON_WEIGHTS = {"p", "w"}  # model.py's loops over parameters (init, nGPT's normalisation)


def test_model_py_changes_no_activation_in_place() -> None:
    """Under FSDP2 an in-place op on a block's output would skip the next block's all-gather;
    runtime/parallel.py silences FSDP's warning about view outputs on the strength of this test.
    Only parameters (in the loops that name them p or w) are changed in place."""
    tree = ast.parse((REPO / PACKAGE / "model.py").read_text(encoding="utf-8"))
    # The initialisers fill parameters before any forward: their in-place calls are no activation's.
    initialisers = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and "init" in f.name]
    skipped = {id(n) for f in initialisers for n in ast.walk(f)}
    found = []
    for node in (n for n in ast.walk(tree) if id(n) not in skipped):
        if isinstance(node, ast.AugAssign) and not (isinstance(node.target, ast.Name) and node.target.id == "n"):
            found.append(f"line {node.lineno}: augmented assignment")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_") \
                and not node.func.attr.startswith("_") and node.func.attr not in ("register_buffer_", ):
            receiver = node.func.value
            if not (isinstance(receiver, ast.Name) and receiver.id in IN_PLACE_ON_WEIGHTS):
                found.append(f"line {node.lineno}: .{node.func.attr}() on {ast.unparse(receiver)}")
    assert not found, "in-place ops in model.py other than on parameters: " + "; ".join(found)
