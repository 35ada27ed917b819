"""The run's code read once per node: compiled into one archive, copied by one task per node to node-local storage,
and imported by every rank from there (docs/performance.md, bring-up at scale).

Every rank imports about a hundred of the launcher's modules. From the frozen copy in the run directory
(launcher/submit/freeze.py) each costs the shared file system's metadata server a directory read, a stat and an open
per rank: at 1,024 ranks, a hundred thousand operations in the same seconds. So the run also keeps its code as one
archive, ``RUN/code.zip``, every module compiled (:func:`pack`: at launch, and again by the job where it does not fit
the tasks' Python or is damaged), and the batch script's stage step (:func:`stage`, on the batch host) has one task
per node copy it, read once and checked, into this user's private node-local folder (launcher/core/nodelocal.py:
made 0700, written under an exclusive name, no link followed) as ``code-<run>-<job>.zip``. The ranks then have that
copy on PYTHONPATH in place of the frozen copy (launcher/slurm/batch.py; the site's own entries stay), which Python's
zipimport reads, and so has the batch script's end step on the host; its steps before this one import the frozen
copy. With ``cluster.stage_env`` the same step, and the same task on each node, stages the tasks' environment too
(launcher/job/stage_env.py), each on its own: the ranks may run the staged environment with the frozen code, or the
reverse.

A traceback still names the frozen file and its line: each module is compiled with its frozen source's path
(``RUN/code/launcher/...py``) as its file name, which Python prints and reads the line from when it prints one; and
SOURCE_ROOT (launcher/core/rundir.py) is that name's root too, so a search's next trials freeze from the frozen copy.

Where a node cannot stage (its node-local place full, unwritable or another user's; the archive damaged), or the
archive cannot be made, every rank of the job imports the frozen copy as without staging, and each such node is named
once in the run's record (``code_not_staged``): a node-local path on PYTHONPATH that one node lacked would be one that
another user could plant there. A copy whose job has ended is removed by the next stage step on its node.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import io
import json
import linecache
import marshal
import os
import re
import shlex
import sys
import tarfile
import types
import zipfile
import zlib
from importlib.machinery import SourceFileLoader
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from launcher.core import nodelocal
from launcher.core.events import CodeNotStaged, EnvNotStaged, EnvPacked, EnvStaged
from launcher.core.rundir import append_event, code_archive, code_dir, frozen_files, write_atomic
from launcher.job import stage_env

# A .pyc's header: this Python's magic number, then flags, source mtime and size, which zipimport checks only against a
# source in the archive, and the archive holds none.
HEADER = importlib.util.MAGIC_NUMBER + bytes(12)
COPY = re.compile(r"code-[0-9a-f]{12}-[^/]+\.zip")  # copy_name's: what the sweep of ended jobs' copies looks at
GRACE_S = 600.0  # a copy is left alone this long after it was made: its job's ranks may not have started yet
STAGE_TIMEOUT_S = 900  # the nodes' copies: an environment of a few GB unpacked; a node that hangs longer is left out
SOURCES = "source"  # the archive's folder of the frozen sources, for the ranks' tracebacks (no module's path)


def stamp(run_dir: Path) -> bytes:
    """The archive's comment: the Python that compiled it (its bytecode's magic number) and the frozen copy its code
    names. An archive with another is made again."""
    return f"{importlib.util.MAGIC_NUMBER.hex()} {code_dir(run_dir)}".encode()


def pack(run_dir: Path, root: Optional[Path] = None) -> None:
    """Compile the run's frozen modules into its archive, each named by its frozen source's path, from ``root`` (the
    checkout they were frozen from, whose cached bytecode then serves; by default the frozen copy itself)."""
    root, frozen, buffer = Path(root or code_dir(run_dir)), code_dir(run_dir), io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:  # fast: made per launch
        for path in frozen_files(root):
            if path.suffix == ".py":
                relative = path.relative_to(root)
                name = ".".join(relative.with_suffix("").parts)
                code = SourceFileLoader(name, str(path)).get_code(name)  # Python's cache of it where fresh
                archive.writestr(relative.with_suffix(".pyc").as_posix(),
                                 HEADER + marshal.dumps(_named(code, str(frozen / relative))))
                archive.writestr(f"{SOURCES}/{relative.as_posix()}", path.read_bytes())
        archive.comment = stamp(run_dir)
    write_atomic(code_archive(run_dir), buffer.getvalue())


def _named(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` and every function's code inside it, named as coming from ``filename``."""
    consts = tuple(_named(const, filename) if isinstance(const, types.CodeType) else const
                   for const in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def problem(data: Optional[bytes], run_dir: Path) -> Optional[str]:
    """Why the archive's bytes ``data`` cannot be imported by this Python for this run (missing, made for another,
    damaged: every member's checksum is checked), or None."""
    if data is None:
        return "missing"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            if archive.comment != stamp(run_dir):
                return f"made for {archive.comment.decode(errors='replace')!r}, not {stamp(run_dir).decode()!r}"
            damaged = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        return f"damaged ({err})"
    return f"damaged ({damaged} fails its checksum)" if damaged else None


def remember_sources(archive: Optional[str]) -> None:
    """Fill Python's cache of source lines (linecache) with the frozen sources in ``archive``, where this process
    imports the launcher from a staged copy. A traceback, and torch's record of every lazy CUDA call (the stack of
    ``import torch``, with its lines), read the line of each frame's file: from the frozen copy, a stat and an open
    on the shared file system per file and rank. Lines a loader gave are never checked against the file again."""
    if archive is None:
        return
    with zipfile.ZipFile(archive) as staged:
        frozen = Path(staged.comment.decode().split(" ", 1)[1])
        for name in staged.namelist():
            if name.startswith(f"{SOURCES}/"):
                text = staged.read(name).decode()
                path = str(frozen / name.removeprefix(f"{SOURCES}/"))
                linecache.cache[path] = (len(text), None, text.splitlines(keepends=True), path)


def copy_name(run_dir: Path, job_id: str) -> str:
    """The name of a job's copy in a node's private folder: keyed by run and job (the local cluster's virtual nodes
    share one machine, and two of its clusters can each have a job of the same id)."""
    return f"code-{hashlib.sha1(str(code_dir(run_dir)).encode()).hexdigest()[:12]}-{job_id}.zip"


def stage(run_dir: Path, code: bool = True, env: bool = False) -> Dict[str, str]:
    """The batch host's step: the code's archive checked (made again where it does not fit this Python, the run's
    directory, or is damaged) and, with ``env``, the environment's (launcher/job/stage_env.py), then each copied by one
    task per node. The variables the ranks' command takes, each only where every node has its copy: ``PYTHONPATH``
    with the code's copy, ``LAUNCHER_TASK_PYTHON`` the environment copy's interpreter; each node that could not is
    recorded, and so is a staged environment."""
    job_id, asked = os.environ.get("SLURM_JOB_ID", "0"), {}
    target = _code_ready(run_dir, job_id) if code else None
    if target is not None:
        asked["code"] = target
    environment = _env_ready(run_dir, job_id) if env else None
    if environment is not None:
        asked["env"] = {**environment.to_json(), "checksum": environment.checksum.read_text().strip()}
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    answers, unanswered = _copies(run_dir, asked, nodes)
    staged = {kind: _everywhere(run_dir, kind, answers, unanswered) for kind in asked}
    if environment is not None and staged.get("env"):
        append_event(run_dir, EnvStaged(job_id=job_id, python=staged["env"], archive=str(environment.archive),
                                        version=environment.version))
    return _variables(run_dir, {kind: path for kind, path in staged.items() if path})


def _everywhere(run_dir: Path, kind: str, answers: List[dict], unanswered: Optional[str]) -> Optional[str]:
    """Where every node put its copy of ``kind`` (``code``, ``env``), or None, each node that could not recorded."""
    event = {"code": CodeNotStaged, "env": EnvNotStaged}[kind]
    failed = [answer[kind] for answer in answers if answer[kind].get("error")]
    for answer in failed:
        append_event(run_dir, event(job_id=os.environ.get("SLURM_JOB_ID"), **answer))
    if unanswered:
        _record(run_dir, event, None, OSError(unanswered))
    return None if failed or unanswered else answers[0][kind]["path"]


def _env_ready(run_dir: Path, job_id: str) -> Optional[stage_env.Environment]:
    """The tasks' environment, its archive checked and packed where it cannot be used (recorded, with why); None where
    it cannot be (recorded)."""
    try:
        environment = stage_env.this_environment(python=os.environ.get(nodelocal.TASK_PYTHON))
        why = stage_env.ensure(environment)
    except (OSError, ValueError, tarfile.TarError) as err:
        _record(run_dir, EnvNotStaged, sys.prefix, err)
        return None
    if why is not None:
        append_event(run_dir, EnvPacked(job_id=job_id, archive=str(environment.archive), version=environment.version,
                                        why=why))
    return environment


def _code_ready(run_dir: Path, job_id: str) -> Optional[str]:
    """The code's archive checked, and made again where it cannot be used: the path of each node's copy, or None where
    it cannot be made (recorded)."""
    archive = code_archive(run_dir)
    try:
        if problem(_read(archive), run_dir):
            pack(run_dir)
    except OSError as err:
        _record(run_dir, CodeNotStaged, str(archive), err)
        return None
    return str(nodelocal.base_path() / copy_name(run_dir, job_id))


def _variables(run_dir: Path, staged: Dict[str, str]) -> Dict[str, str]:
    """The batch shell's variables for what every node staged: the code's copy first on PYTHONPATH in place of the
    frozen copy, the environment copy's interpreter for the ranks."""
    exports = {}
    if "code" in staged:
        rest = [path for path in os.environ.get("PYTHONPATH", "").split(":")
                if path and Path(path) != code_dir(run_dir)]
        exports["PYTHONPATH"] = ":".join([staged["code"], *rest])
    if "env" in staged:
        exports[nodelocal.TASK_PYTHON] = staged["env"]
    return exports


def _copies(run_dir: Path, asked: Dict[str, Any], nodes: int) -> Tuple[List[dict], Optional[str]]:
    """Every node's :func:`copy` of what was ``asked``, one task per node through srun: their answers, and why some
    node gave none (None when each did)."""
    from launcher.slurm.client import on_every_node  # lazy: a node's own step runs no Slurm tool

    if not asked:
        return [], None
    command = [sys.executable, "-m", __spec__.name, "node", str(run_dir), json.dumps(asked)]
    try:
        said, ended = on_every_node(command, nodes, timeout=STAGE_TIMEOUT_S)
    except OSError as err:
        return [], f"srun could not run: {err}"
    answers = []
    for line in said.splitlines():
        with contextlib.suppress(ValueError):
            answers.append(json.loads(line))
    answers = [answer for answer in answers if isinstance(answer, dict) and set(asked) <= set(answer)]
    if len(answers) >= nodes:
        return answers, None
    return answers, f"{nodes - len(answers)} of {nodes} nodes' stage step ended without a word ({ended})"


def copy(run_dir: Path, asked: Dict[str, Any]) -> dict:
    """One node's part: the run's code archive read once, checked, and written to ``asked["code"]`` in this user's
    node-local folder, after removing the copies of jobs that ended; and the environment unpacked there
    (``asked["env"]``: launcher/job/stage_env.py). What happened to each, as its ``*_not_staged`` event's fields, with
    ``path`` the copy's (the environment's: its interpreter)."""
    node = os.environ.get("SLURMD_NODENAME")
    answer: Dict[str, Any] = {}
    if asked.get("code"):
        target = Path(asked["code"])
        answer["code"] = _attempt(node, target, lambda: _copy_code(run_dir, target))
    if asked.get("env"):
        env = asked["env"]
        environment = stage_env.Environment.from_json(env)
        folder_path = nodelocal.base_path()
        answer["env"] = _attempt(node, folder_path / environment.name,
                                 lambda: _unpack_env(environment, env["checksum"], folder_path))
    return answer


def _attempt(node: Optional[str], path: Path, work: Callable[[], Optional[Path]]) -> dict:
    """``work``'s answer: where it put its copy, else its error."""
    answer: Dict[str, Any] = {"node": node, "path": str(path)}
    try:
        answer["path"] = str(work() or path)
    except (OSError, ValueError, tarfile.TarError, nodelocal.Taken) as err:
        answer.update(error=str(err), errno=errno.errorcode.get(getattr(err, "errno", None) or 0))
    return answer


def _copy_code(run_dir: Path, target: Path) -> None:
    data = code_archive(run_dir).read_bytes()
    damaged = problem(data, run_dir)
    if damaged:
        raise ValueError(f"{code_archive(run_dir)}: {damaged}")
    with nodelocal.Folder.open(target.parent) as folder:
        remove_ended(folder, keep=target.name)
        folder.write(target.name, data)


def _unpack_env(environment: stage_env.Environment, checksum: str, folder_path: Path) -> Path:
    """The environment's copy on this node (launcher/job/stage_env.py): its interpreter's path."""
    with nodelocal.Folder.open(folder_path) as folder:
        stage_env.remove_unused(folder, keep=environment.name)
        staged = stage_env.unpack(environment.archive, checksum, folder, environment)
    return staged / environment.python.relative_to(environment.prefix)


def remove_ended(folder: nodelocal.Folder, keep: str) -> None:
    """Remove this user's copies in ``folder`` (but ``keep``) that no process of this user's on the node imports from
    (none has it on its PYTHONPATH) and that are older than :data:`GRACE_S`. Only this user's files, by name."""
    for name in folder.older(COPY, "file", GRACE_S):
        if name != keep and not in_use(str(folder.path / name)):
            folder.remove(name)


def in_use(path: str) -> bool:
    """Whether a process of this user's on the node has ``path`` on its PYTHONPATH (as it started: a job's ranks, and
    the batch script's steps after its stage step)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or another user's
        if any(entry.startswith(b"PYTHONPATH=") and path.encode() in entry[11:].split(b":") for entry in environ):
            return True
    return False


def _read(path: Path) -> Optional[bytes]:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _record(run_dir: Path, event: type, path: Optional[str], err: Exception) -> None:
    """A ``*_not_staged`` event of the job's as a whole (no one node's): its archive could not be made, or some node's
    stage step gave no answer."""
    append_event(run_dir, event(job_id=os.environ.get("SLURM_JOB_ID"), path=path, error=str(err),
                                errno=errno.errorcode.get(getattr(err, "errno", None) or 0)))


def main(argv: Sequence[str]) -> int:
    """``RUN [code] [env]``: the batch host's step, printing the shell assignments of the variables the ranks take
    (none where the job runs the frozen copy and the shared environment); ``node RUN ASKED``: one node's copies
    (``ASKED``: JSON), printing what happened as one line of JSON."""
    args: List[str] = list(argv)
    if len(args) == 3 and args[0] == "node":
        print(json.dumps(copy(Path(args[1]), json.loads(args[2]))), flush=True)
        return 0
    if not args or not set(args[1:]) <= {"code", "env"}:
        print("usage: python -m launcher.job.stage RUN_DIR [code] [env] | node RUN_DIR ASKED", file=sys.stderr)
        return 2
    for name, value in stage(Path(args[0]), "code" in args[1:], "env" in args[1:]).items():
        print(f"{name}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
