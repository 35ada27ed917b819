"""The boundaries the design promises, checked on the source so that they cannot erode unnoticed: no import
cycle among our modules (imports inside functions count), packages that import only the layers below them,
launcher/train/ that reaches the launcher only through its torch-free contract (launcher/core), an in-job path that
never loads Hydra or the CLI, package docstrings that name the packages they import truly, functions of at most
60 lines, a training loop that reads as the step, and lines a reader takes in. (That one package speaks to Slurm is checked in
test_slurm_units.py.) The layers and what each package owns are in docs/layout.md.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Dict, List, Set

import pytest
from support.helpers import REPO

SOURCES = sorted(REPO.glob("launcher/**/*.py"))
LINE_LIMIT = 120
SOFT_MODULE_LINES = 400

# The launcher's layers, lowest first: a package may import its own modules and those of layers below it.
# ``launcher`` is the package's own __init__ (the version), ``errors`` the one error type.
LAYERS: List[Set[str]] = [
    {"launcher", "launcher.core"},
    {"launcher.train"},  # what every task runs: torch; only the task entry and `sample` import it
    {"launcher.errors"},
    {"launcher.dataset", "launcher.slurm"},
    {"launcher.compose", "launcher.status"},
    {"launcher.job", "launcher.forecast"},
    {"launcher.submit"},
    {"launcher.search"},  # searches: compose and submit trials, at the launch and from a trial's last step
    {"launcher.remote"},  # clusters over SSH: ships the code and submits there through submit/
    {"launcher.views"},  # what the commands share: finding runs, a search's tables, the plots
    {"launcher.service"},  # what both front ends do: stop, resume, delete, list, describe, survey; never prints
    {"launcher.commands", "launcher.console"},  # the two front ends: the CLI's commands and the web console
    {"launcher.cli", "launcher.__main__"},
]
# What launcher/core may import besides itself: the standard library and these.
CORE_MAY_IMPORT = {"omegaconf", "yaml"}
# The object store's client, inside the functions of the one module that reaches a bucket (docs/layout.md).
STORE_CLIENT = {"store.py": {"boto3", "botocore"}}


def module_name(path: Path, root: Path = REPO) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = REPO) -> Set[str]:
    """Every module ``path`` imports, anywhere in it (inside functions too), relative imports resolved, and
    ``from package import module`` counted as the module."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(root: Path = REPO, tops: tuple = ("launcher",)) -> Dict[str, Set[str]]:
    """Our modules and the modules of ours each imports."""
    paths = [p for top in tops for p in sorted((root / top).glob("**/*.py"))]
    modules = {module_name(p, root): p for p in paths}
    return {name: {m for m in imports_of(path, root) if m in modules and m != name} for name, path in modules.items()}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle through each strongly connected group of modules that import each other (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_of(module: str) -> int:
    for depth, packages in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in packages if p != "launcher") or module == "launcher":
            return depth
    raise AssertionError(f"{module} belongs to no layer of tests/unit/test_architecture.py's LAYERS")


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


GRAPH = import_graph()


def test_no_import_cycle_among_our_modules():
    assert cycles(GRAPH) == [], "modules that import each other (inside functions too)"


def test_the_cycle_check_counts_imports_inside_functions(tmp_path):
    """A cycle closed by an import inside a function, as ``cli -> commands.launch -> submit -> cli`` once was,
    is found."""
    pkg = tmp_path / "launcher"
    (pkg / "commands").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "commands" / "__init__.py").write_text("")
    (pkg / "cli.py").write_text("def main():\n    from launcher.commands import launch\n")
    (pkg / "commands" / "launch.py").write_text("from launcher import submit\n")
    (pkg / "submit.py").write_text("def hint():\n    from launcher.cli import main\n")
    (pkg / "other.py").write_text("from . import submit\n")
    assert cycles(import_graph(tmp_path, ("launcher",))) == [["launcher.cli", "launcher.commands.launch",
                                                              "launcher.submit"]]


# The one import up the layers: a search trial's last step (the batch script's ``end``, after srun) reports it and
# submits the next trials, composing them; a run that is no trial never imports it.
UPWARD_ALLOWED = {("launcher.job.recovery", "launcher.search.hook")}


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith("launcher")))
def test_each_package_imports_only_its_own_layer_and_those_below(module):
    upward = sorted(dep for dep in GRAPH[module] if dep.startswith("launcher") and (module, dep) not in UPWARD_ALLOWED
                    and layer_of(dep) > layer_of(module) and package_of(dep) != package_of(module))
    assert not upward, f"{module} (layer {layer_of(module)}) imports {upward} from a layer above it"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith("launcher")
                                          and layer_of(m) < layer_of("launcher.commands")))
def test_only_commands_and_the_cli_import_a_command(module):
    bad = sorted(dep for dep in GRAPH[module] if dep.startswith(("launcher.commands", "launcher.cli")))
    assert not bad, f"{module} imports {bad}"


def test_same_layer_packages_do_not_import_each_other_both_ways():
    packages: Dict[str, Set[str]] = {}
    for module, deps in GRAPH.items():
        packages.setdefault(package_of(module), set()).update(package_of(d) for d in deps)
    both = sorted({tuple(sorted((a, b))) for a, deps in packages.items() for b in deps
                   if a != b and a in packages.get(b, set())})
    assert not both, f"packages that import each other: {both}"


@pytest.mark.parametrize("path", sorted(REPO.glob("launcher/core/*.py")), ids=lambda p: p.name)
def test_core_imports_only_core_the_standard_library_omegaconf_and_yaml(path):
    allowed = sys.stdlib_module_names | CORE_MAY_IMPORT | STORE_CLIENT.get(path.name, set()) | {"__future__"}
    bad = sorted(name for name in imports_of(path)
                 if not name.startswith("launcher.core") and name != "launcher.core" and name.split(".")[0] not in
                 allowed)
    assert not bad, f"launcher/core/{path.name} imports {bad}"


@pytest.mark.parametrize("path", sorted(REPO.glob("launcher/train/**/*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_train_imports_only_the_contract_from_the_launcher(path):
    outside = sorted(name for name in imports_of(path)
                     if name.split(".")[0] == "launcher" and name not in ("launcher.core", "launcher.train")
                     and not name.startswith(("launcher.core.", "launcher.train.")))
    assert not outside, f"{path.relative_to(REPO)} imports {outside}; launcher/train/ may import only launcher.core"


def test_the_in_job_path_loads_neither_hydra_nor_the_cli():
    """What a plain run's job imports (the batch script's recovery steps, the task, its resubmission) loads no
    Hydra, no composition, no CLI and no command: a requeue or a retry must not pay for them."""
    code = ("import sys, launcher.job.recovery, launcher.job.comment, launcher.job.entry, launcher.job.submission, "
            "launcher.train.task; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'hydra' or m.startswith(("
            "'launcher.cli', 'launcher.commands', 'launcher.compose.composer', 'launcher.compose.overrides', "
            "'launcher.submit'))); print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_lines_fit_in_120_columns(path):
    long = [number for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > LINE_LIMIT]
    assert not long, f"{path.relative_to(REPO)}: lines {long} are longer than {LINE_LIMIT} columns"


def test_long_modules_are_named():
    """Length is a hint, not a rule: a module past ~400 lines is named in the warnings summary, to be read
    as a candidate for a split along its concerns."""
    for path in SOURCES:
        lines = len(path.read_text().splitlines())
        if lines > SOFT_MODULE_LINES:
            warnings.warn(f"{path.relative_to(REPO)} has {lines} lines (over {SOFT_MODULE_LINES}: worth a look)")


FUNCTION_LINES = 60
PACKAGES = sorted(REPO.glob("launcher/*/__init__.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_function_is_longer_than_60_lines(path):
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > FUNCTION_LINES]
    assert not long, f"{path.relative_to(REPO)}: {', '.join(long)} over {FUNCTION_LINES} lines"


def unexplained_lazy_imports(source: str) -> List[int]:
    """The lines of imports inside a function with no comment on the line or the one above: a module's imports
    are at its top unless importing there would cost start-up or pull torch into the launcher, and then the
    line says so (``# lazy: keeps hydra out of start-up``)."""
    lines = source.splitlines()
    return sorted({node.lineno for func in ast.walk(ast.parse(source))
                   if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for node in ast.walk(func) if isinstance(node, (ast.Import, ast.ImportFrom))
                   and "#" not in lines[node.lineno - 1] and not lines[node.lineno - 2].lstrip().startswith("#")})


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_an_import_inside_a_function_says_why(path):
    lines = unexplained_lazy_imports(path.read_text())
    assert not lines, f"{path.relative_to(REPO)}: the imports on lines {lines} belong at the top, or say why not"


def test_the_lazy_import_check_sees_an_unexplained_one():
    source = "import os\n\n\ndef f():\n    import json\n    import yaml  # lazy: keeps yaml out of start-up\n"
    assert unexplained_lazy_imports(source) == [5]


@pytest.mark.parametrize("path", PACKAGES, ids=lambda p: p.parent.name)
def test_a_package_docstring_names_the_packages_it_imports(path):
    """Each package's docstring ends with ``Imports: a, b.`` (or ``Imports: none.``), the launcher's packages its
    modules import (inside functions too): the claim a reader takes the layout from is the import graph."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    claim = re.search(r"^Imports: (.*)\.$", doc, re.MULTILINE)
    assert claim, f"{path.relative_to(REPO)}: its docstring has no 'Imports: ...' line"
    declared = set() if claim.group(1) == "none" else set(claim.group(1).split(", "))
    package = module_name(path)
    actual = {package_of(dep).removeprefix("launcher.") for module, deps in GRAPH.items()
              if package_of(module) == package for dep in deps
              if package_of(dep) not in (package, "launcher")}
    assert declared == actual, f"{path.relative_to(REPO)} says it imports {sorted(declared)}; it imports {sorted(actual)}"


def test_the_training_loop_reads_as_the_step():
    """train()'s loop body is the step and its components, at most about 30 lines (launcher/train/loop.py)."""
    tree = ast.parse((REPO / "launcher/train/loop.py").read_text())
    train = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    (loop,) = [n for n in ast.walk(train) if isinstance(n, (ast.For, ast.While))]
    assert loop.end_lineno - loop.lineno + 1 <= 30


def test_the_wheel_lists_every_package():
    """pyproject.toml names its packages one by one: a package left out installs without it (the launcher then
    fails at its first import of it on a site that pip-installed it)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {module_name(path) for path in REPO.glob("launcher/**/__init__.py")}
    assert listed - {"launcher.conf"} == packages


def test_the_console_neither_parses_arguments_nor_catches_output_nor_imports_a_command():
    """The console and the CLI are two front ends on launcher/service/: the console builds no argparse Namespace,
    catches no command's printed words (redirect_stdout) and imports no command (``launcher ui`` starts it)."""
    for path in sorted(REPO.glob("launcher/console/**/*.py")):
        tree = ast.parse(path.read_text())
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | {
            node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        bad = sorted({name for name in imports_of(path) if name == "argparse" or name.startswith("launcher.commands")}
                     | (names & {"redirect_stdout", "redirect_stderr"}))
        assert not bad, f"{path.relative_to(REPO)} uses {bad}"


@pytest.mark.parametrize("path", sorted(REPO.glob("launcher/service/*.py")), ids=lambda p: p.name)
def test_the_service_neither_prints_nor_parses_arguments(path):
    """What both front ends share returns records and raises one-line errors; the front ends say them."""
    tree = ast.parse(path.read_text())
    prints = [node.lineno for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]
    assert not prints and "argparse" not in imports_of(path), f"{path.relative_to(REPO)}: print on lines {prints}"


ATTEMPT_EVENTS = {"Attempt", "AttemptEnded"}
ATTEMPT_READER = REPO / "launcher/core/attempt_log.py"


def attempt_type_tests(source: str) -> List[int]:
    """The lines of ``source`` that test an event for ``attempt`` or ``attempt_ended``: ``isinstance`` with either
    type, alone, in a tuple, or in a tuple the module names (``STANDING = (Attempt, ...)``)."""
    tree = ast.parse(source)

    def named(node: ast.expr) -> str:
        return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""

    def kinds(node: ast.expr) -> Set[str]:
        return {named(e) for e in node.elts} if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else {named(node)}

    bound = {target.id: kinds(node.value) for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name)}
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and named(node.func) == "isinstance" and len(node.args) == 2
                  and (kinds(node.args[1]) | bound.get(named(node.args[1]), set())) & ATTEMPT_EVENTS)


@pytest.mark.parametrize("path", [p for p in SOURCES if p != ATTEMPT_READER], ids=lambda p: str(p.relative_to(REPO)))
def test_only_the_attempt_log_tests_for_attempt_events(path):
    """Every question about attempts (which ended how, which nodes were blamed, which is the newest) is a method of
    launcher/core/attempt_log.py's AttemptLog: the one reader of ``attempt`` and ``attempt_ended`` events."""
    lines = attempt_type_tests(path.read_text())
    assert not lines, (f"{path.relative_to(REPO)}: lines {lines} test for an attempt event; ask "
                       "launcher/core/attempt_log.py's AttemptLog instead")


def test_the_attempt_event_check_sees_each_form():
    source = ("KINDS = (Attempt, Failed)\nisinstance(e, AttemptEnded)\nisinstance(e, (Failed, events.Attempt))\n"
              "isinstance(e, KINDS)\nisinstance(e, Failed)\nlog.newest(Attempt)\n")
    assert attempt_type_tests(source) == [2, 3, 4]


# metrics.jsonl's rows (launcher/core/metrics.py): the codec turns a line into a typed row and a row into a line;
# the run directory's readers and writer of the file and the growing file's reader (launcher/status/tails.py) go
# through it. A row is a line's object again only where it leaves as one: the console's JSON over SSH, ``describe
# --json`` (launcher/service/describe.py) and the console's pages, whose curves name the rows' keys as their JSON
# does (launcher/console/readers.py).
ROW_CODEC = {"launcher/core/metrics.py", "launcher/core/rundir.py", "launcher/status/tails.py"}
ROW_LINES = {"launcher/remote/agent.py", "launcher/service/describe.py", "launcher/console/readers.py"}
LINE_CODEC = {"encode", "decode", "parse"}
JSON_READERS = {("json", "loads"), ("json", "load"), (None, "read_jsonl"), (None, "numbered_jsonl")}


def row_place(path: Path) -> str:
    return str(path.relative_to(REPO))


def row_line_codec_users(source: str) -> Set[str]:
    """What of the rows' line codec a module imports: ``encode``, ``decode``, ``parse`` by name, or the module."""
    used: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "launcher.core.metrics":
            used.update(alias.name for alias in node.names if alias.name in LINE_CODEC)
        elif isinstance(node, ast.ImportFrom) and node.module == "launcher.core":
            used.update("the module" for alias in node.names if alias.name == "metrics")
    return used


def test_only_the_codec_turns_metrics_lines_into_rows_and_back():
    """A module reads a row's fields: it never holds a row as a line's object, so it cannot read one by key."""
    found = {row_place(path): row_line_codec_users(path.read_text()) for path in SOURCES}
    outside = {place: sorted(used) for place, used in found.items() if used
               and place not in ROW_CODEC | ROW_LINES}
    assert not outside, f"these turn metrics rows into lines or back outside launcher/core/metrics.py: {outside}"


def metrics_file_parsed(source: str) -> List[str]:
    """The functions that name metrics.jsonl (``METRICS`` or the name itself) and parse JSON lines themselves."""
    found = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = list(ast.walk(func))
        names_file = any(isinstance(n, ast.Name) and n.id == "METRICS" or isinstance(n, ast.Constant)
                         and n.value == "metrics.jsonl" for n in nodes)
        calls = {(getattr(c.func.value, "id", None) if isinstance(c.func, ast.Attribute) else None,
                  c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", None))
                 for c in nodes if isinstance(c, ast.Call)}
        if names_file and calls & JSON_READERS:
            found.append(func.name)
    return found


def test_no_module_but_the_codec_parses_metrics_jsonl():
    parsed = {row_place(path): metrics_file_parsed(path.read_text()) for path in SOURCES}
    outside = {place: names for place, names in parsed.items() if names and place not in ROW_CODEC}
    assert not outside, f"these parse metrics.jsonl themselves, not through launcher/core/metrics.py: {outside}"


def test_the_metrics_checks_see_a_module_that_reads_rows_itself():
    assert row_line_codec_users("from launcher.core.metrics import Row, decode as d\n") == {"decode"}
    assert row_line_codec_users("from launcher.core import metrics\n") == {"the module"}
    source = "def f(run_dir):\n    return [json.loads(l) for l in open(run_dir / METRICS)]\n"
    assert metrics_file_parsed(source) == ["f"]


def test_a_row_is_read_by_its_fields_not_by_a_key_named_in_the_code():
    """``Row.value(name)`` is for names that come from elsewhere (a search's metric, the trackers' table); a name
    written in the code is the field's."""
    named = {}
    for path in SOURCES:
        lines = [node.lineno for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Attribute) and node.func.attr == "value" and node.args
                 and isinstance(node.args[0], ast.Constant)]
        if lines:
            named[str(path.relative_to(REPO))] = sorted(lines)
    assert not named, f"these read a row's field by a name written in the code, not as the field: {named}"


def private_submitit_uses(source: str) -> List[str]:
    """Where ``source`` reaches into submitit's private names, which a release may rename without notice: an
    import of a module or name starting with ``_`` (``submitit.core._submit``, ``_make_sbatch_string``), an
    attribute starting with ``_`` of anything imported from submitit (``SlurmExecutor._submitit_command_str``), a
    subclass of a submitit class that overrides or calls its ``_`` methods (``_submit_command``), and a string that
    names such a module path (``python -m submitit.core._submit``). Docstrings may name them."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    bound: Set[str] = set()  # the names submitit's modules and objects are bound to here
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in (a for a in node.names if a.name.split(".")[0] == "submitit"):
                bound.add((alias.asname or alias.name).split(".")[0])
                if any(part.startswith("_") for part in alias.name.split(".")):
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "submitit":
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if any(part.startswith("_") for part in [*node.module.split("."), alias.name]):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings \
                and re.search(r"\bsubmitit(\.\w+)*\._", node.value):
            found.append(f"line {node.lineno}: the string {node.value!r}")

    def root(node: ast.AST) -> str:
        while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return node.id if isinstance(node, ast.Name) else ""

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and root(node.value) in bound:
            found.append(f"line {node.lineno}: .{node.attr} of submitit's {root(node.value)}")
        if isinstance(node, ast.ClassDef) and any(root(base) in bound for base in node.bases):
            found += [f"line {item.lineno}: {node.name} reaches its submitit base's {name}" for item in ast.walk(node)
                      for name in [item.name if isinstance(item, ast.FunctionDef) else item.attr
                                   if isinstance(item, ast.Attribute) and root(item) == "self" else ""]
                      if name.startswith("_") and not name.startswith("__")]
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_submitit_is_reached_only_through_its_public_names(path):
    """One way into submitit, its public API; what that cannot say is the launcher's own (launcher/job/task.py)."""
    found = private_submitit_uses(path.read_text())
    assert not found, f"{path.relative_to(REPO)} uses submitit's private names: {'; '.join(found)}"


def test_the_submitit_check_sees_each_kind_of_private_use():
    source = '''"""Docstrings may say submitit.core._submit."""
import submitit.core._submit
from submitit.slurm.slurm import SlurmExecutor, _make_sbatch_string
from submitit.core import utils as u


class Cluster(SlurmExecutor):
    def _submit_command(self, command):
        return self._write_job_id(u.JobPaths._private, "x")


COMMAND = "python -u -m submitit.core._submit"
LINE = SlurmExecutor._submitit_command_str.fget(None)
'''
    found = sorted(int(line.split(":")[0].removeprefix("line ")) for line in private_submitit_uses(source))
    assert found == [2, 3, 8, 9, 9, 12, 13], private_submitit_uses(source)
    assert private_submitit_uses("import submitit\nfrom submitit.helpers import DelayedSubmission\n"
                                 "submitit.JobEnvironment().job_id\n") == []


def test_every_table_is_fitted_to_the_terminal():
    """A table a command prints goes through launcher/views/width.py's ``fit_table``, which narrows it to the
    terminal's width (docs/launching.md): no other module calls tabulate itself."""
    fitted = REPO / "launcher" / "views" / "width.py"
    calls = [str(path.relative_to(REPO)) for path in SOURCES
             if path != fitted and re.search(r"\btabulate\(", path.read_text())]
    assert not calls, f"{calls} call tabulate: use launcher.views.width.fit_table"
