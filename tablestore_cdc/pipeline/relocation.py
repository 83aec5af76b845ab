"""A moved or copied ``--output`` directory resumes where the old one stopped (CLI process,
driver, before Spark starts). docs/operations.md, "Moving a job", tells the whole design.

Under ``OUTPUT`` only two of Spark's logs name files by their absolute URI (``PATH_LOGS``): the
change-log query's file-sink log and the apply query's file-source log; everything else is
relative or not a path. Left as they were, the moved apply query fails with ``Wrong basePath``
on every restart. So ``relocate`` (``job.open_job``, under the job's lock) rewrites those logs'
paths to the directory the job runs in now, each file on its own and atomically, its Hadoop
checksum removed first (``_replace``): a kill at any point leaves each file old or new, and the
next start rewrites only the old ones. Both logs name a file by the same rewritten string, so
the apply query still knows each file it has taken: nothing is read twice, nothing skipped.

What cannot move with the directory: a target under the old directory named by its own
``--target`` (or a ``--config`` target): ``check_targets`` (``preflight``) refuses it in one
line (``MovedTargetError``), else the moved job would apply to the old place, or to a new empty
table from the middle of the stream.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

from cdc_common.errors import CdcError

#: the logs under ``OUTPUT`` that name change-log files by absolute URI
PATH_LOGS = (Path("changelog") / "_spark_metadata",
             Path("_checkpoints") / "apply" / "sources" / "0")
#: what ``job.open_job`` says once the paths were rewritten
MOVED_LINE = "{output} was moved from {old}; its change-log paths now point here"
#: characters a Hadoop (java.net.URI) path keeps as they are, besides letters and digits
_URI_PATH_SAFE = frozenset("/-_.!~*'(),;:$&+=@")


class MovedTargetError(CdcError):
    """A moved output's target still lies under the directory it was moved from."""

    exit_code = 2
    template = ("{output} was moved from {old}, but target {target} still lies under {old}: "
                "give --target (or the --config target) at its new place, e.g. under "
                "{output}, and start again")


class PathLogError(CdcError):
    """A Spark log under the output directory is not what Spark writes."""

    exit_code = 1
    template = ("{file} line {line} is not a log entry Spark writes ({problem}): the output "
                "directory's checkpoints are damaged; restore them or start a new --output")


def moved_from(output: Path) -> Path | None:
    """The output directory the job's path logs name when it is not ``output`` (the job was
    moved or copied from there), else None: read only (``preflight``, before the lock)."""
    for file in _log_files(output):
        for entry in _entries(file)[1]:
            old = _old_output(entry, output)
            if old is not None:
                return old
    return None


def relocate(output: Path) -> Path | None:
    """Rewrite every path of the path logs that names another output directory to ``output``
    (module docstring; called by ``job.open_job`` under the job's lock, before Spark); the
    directory they named, or None when nothing had to move."""
    moved: Path | None = None
    for file in _log_files(output):
        header, entries, trailing = _entries(file)
        changed = False
        for entry in entries:
            old = _old_output(entry, output)
            if old is not None:
                entry["path"] = hadoop_uri(output / "changelog" / _name_of(entry))
                moved, changed = moved or old, True
        if changed:
            lines = [header, *(json.dumps(e, separators=(",", ":"), ensure_ascii=False)
                               for e in entries)]
            _replace(file, "\n".join(lines) + ("\n" if trailing else ""))
    return moved


def check_targets(output: Path, old: Path, targets: Iterable[str]) -> None:
    """``MovedTargetError`` for the first local target URI (``delta:///..``,
    ``iceberg:///..``; ``{table}`` as a name) under ``old``, the directory ``output`` was moved
    from (``preflight``)."""
    for target in targets:
        parts = urlsplit(target.replace("{table}", "table"))
        if parts.netloc or not parts.path.startswith("/"):
            continue  # an object store or a catalog: not a path of this machine
        if Path(unquote(parts.path)).is_relative_to(old):
            raise MovedTargetError(output=str(output), old=str(old), target=target)


def hadoop_uri(path: Path) -> str:
    """``path`` as Spark (Hadoop's ``Path.toUri``, a multi-argument ``java.net.URI``) writes a
    local file in its logs: ``file://`` and the path, an ASCII character outside the URI's
    path characters percent-encoded, any other kept as it is."""
    quoted = []
    for char in str(path):
        kept = char.isalnum() or char in _URI_PATH_SAFE if char.isascii() else char.isprintable()
        quoted.append(char if kept else "".join(f"%{b:02X}" for b in char.encode()))
    return "file://" + "".join(quoted)


def _log_files(output: Path) -> Iterator[Path]:
    """The batch files of the path logs (``N``, ``N.compact``): Spark's own names."""
    for folder in PATH_LOGS:
        with contextlib.suppress(OSError):
            for file in sorted((output / folder).iterdir()):
                if file.name.partition(".")[0].isdigit() and file.is_file():
                    yield file


def _entries(file: Path) -> tuple[str, list[dict[str, object]], bool]:
    """A log file's version line, its entries and whether it ends in a newline
    (``PathLogError`` for what Spark does not write)."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PathLogError(file=str(file), line=1, problem=str(exc)) from None
    lines = text.split("\n")
    trailing = lines[-1] == ""
    if trailing:
        lines.pop()
    if not lines or not lines[0].startswith("v"):
        raise PathLogError(file=str(file), line=1, problem="no version line")
    entries = []
    for n, line in enumerate(lines[1:], start=2):
        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise PathLogError(file=str(file), line=n, problem="no JSON object with a path")
        entries.append(entry)
    return lines[0], entries, trailing


def _local_path(entry: dict[str, object]) -> Path | None:
    parts = urlsplit(str(entry["path"]))
    if parts.scheme not in ("file", "") or parts.netloc:
        return None
    return Path(unquote(parts.path))


def _name_of(entry: dict[str, object]) -> str:
    path = _local_path(entry)
    assert path is not None
    return path.name


def _old_output(entry: dict[str, object], output: Path) -> Path | None:
    """The output directory an entry's change-log file lies in, when not ``output``."""
    path = _local_path(entry)
    if path is None or path.parent == output / "changelog":
        return None
    return path.parent.parent


def _replace(file: Path, text: str) -> None:
    """``file``'s new content, atomically; its Hadoop checksum removed first (module
    docstring: a kill in between leaves the old content without a checksum, which Spark
    reads, and the next start rewrites)."""
    with contextlib.suppress(FileNotFoundError):
        (file.parent / f".{file.name}.crc").unlink()
    tmp = file.parent / f".{file.name}.relocating"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, file)


__all__ = ["MOVED_LINE", "PATH_LOGS", "MovedTargetError", "PathLogError", "check_targets",
           "hadoop_uri", "moved_from", "relocate"]
