"""Output that fits the terminal: the width to fit (``COLUMNS``, else the terminal's, else 100 for a pipe or a
file), a table narrowed to it and lines wrapped to it, for every command that prints a table or a note.

A table too wide first wraps its free-text columns (each down to the narrowest its command allows) and its headers
by words, then leaves out its least needed columns, in the order its command gives, and says so in a line under it;
the whole of every cell is in the command's ``--json``. A line too wide wraps by words, its continuation indented.
A refusal (``error: ...``, launcher/cli.py) or a finding (``warning: ...``) on stderr is one line where a script or
a log reads it, and wrapped as a note where a person does (:func:`to_stderr`)."""
from __future__ import annotations

import shutil
import sys
import textwrap
from typing import Dict, List, Optional, Sequence, Union

FALLBACK_COLUMNS = 100
GAP = 2  # between two columns, in tabulate's "simple" and "plain" formats
PAD = 2  # tabulate's room beside a header (its MIN_PADDING)


def terminal_width() -> int:
    """``COLUMNS``, else the width of the terminal standard output is, else 100 (a pipe or a file)."""
    return shutil.get_terminal_size((FALLBACK_COLUMNS, 24)).columns


def wrap(text: str, width: Optional[int] = None, indent: str = "  ") -> str:
    """``text`` with each line wider than ``width`` wrapped by words (a word wider than a line is cut), each
    continuation starting with the line's own indentation and ``indent``."""
    width = width or terminal_width()
    out: List[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())][:width // 2]
        out += textwrap.wrap(line.strip(), width, initial_indent=lead, subsequent_indent=(lead + indent)[:width // 2])
    return "\n".join(out)


def fold_script(text: str, width: Optional[int] = None, indent: str = "    ") -> str:
    """A shell script as printed for a person (a dry run's), each command line wider than ``width`` folded so that the
    text is still the same script: bash joins a backslash and its newline. A line breaks at a space between words
    past the line's middle (the next line indented), else within a word (a path: after a ``/`` where one is near),
    the next line then starting at its first column, since an indentation there would be part of the word. Nothing
    breaks within single quotes, ``${...}`` or a comment; comment lines (``#SBATCH`` directives among them) stay
    whole, as a directive's backslash would not continue it."""
    width = width or terminal_width()
    out: List[str] = []
    for line in text.split("\n"):
        if line.lstrip().startswith("#"):
            out.append(line)
            continue
        spaces, joins = _breaks(line)
        start, lead = 0, ""
        while len(lead) + len(line) - start > width:
            room = start + width - len(lead)
            space = max((i for i in spaces if start < i <= room - 2 and line[start:i].strip()), default=None)
            join = max((i for i in joins if start < i <= room - 1), default=None)
            half = start + (room - start) // 2
            if space is not None and (space > half or join is None):  # else a short line, a long word after it
                out.append(lead + line[start:space] + " \\")
                start, lead = next((i for i in range(space, len(line)) if line[i] != " "), len(line)), indent
            elif join is not None:
                slash = max((i for i in joins if half < i <= join and line[i - 1] == "/"), default=join)
                out.append(lead + line[start:slash] + "\\")
                start, lead = slash, ""
            else:
                break
        out.append(lead + line[start:])
    return "\n".join(out)


def _breaks(line: str) -> tuple:
    """Where ``line`` may break: before the spaces between its words, and within its words (each a place to put
    a backslash and a newline): never within single quotes, ``${...}`` or a comment, nor after a backslash or a
    ``$``."""
    spaces, joins, braces, quote = [], [], 0, ""
    for i, char in enumerate(line):
        before = line[i - 1] if i else ""
        if quote != "'" and not braces and i and before not in "\\$" and char != " " and before != " ":
            joins.append(i)
        if quote:
            quote = "" if char == quote and not (before == "\\" and quote == '"') else quote
        elif char in "'\"" and before != "\\":
            quote = char
        elif char == "{" and before == "$":
            braces += 1
        elif char == "}" and braces:
            braces -= 1
        elif char == "#" and before in (" ", ""):
            break  # a comment to the line's end
        elif char == " " and not braces and before not in (" ", "\\"):
            spaces.append(i)
    return spaces, joins


def to_stderr(text: str) -> None:
    """``text`` on stderr: wrapped by words to the terminal's width when stderr is a terminal (a person reads it),
    else one line (a script that reads a command's refusal, or a log, takes it whole)."""
    print(wrap(text) if sys.stderr.isatty() else text, file=sys.stderr, flush=True)


Key = Union[str, int]  # a column by its header, or by its place (a table without headers)


def fit_table(rows: Sequence[Sequence[object]], headers: Sequence[str] = (), wrap_to: Optional[Dict[Key, int]] = None,
              drop: Sequence[str] = (), width: Optional[int] = None, **options) -> str:
    """``tabulate(rows, headers, **options)`` within ``width``: the columns of ``wrap_to`` (by header or place) each
    wrapped by words down to its narrowest, widest first, then headers wider than their cells wrapped, then the
    columns of ``drop`` left out in its order, then the rightmost but the first, until the table fits; the room
    the left-out columns leave goes back to the wrapped ones. Cells are shown as text, as given (numbers formatted
    by the caller)."""
    from tabulate import tabulate  # lazy: keeps tabulate out of start-up

    width = width or terminal_width()
    table = Table([[("" if cell is None else str(cell)) for cell in row] for row in rows], list(headers))
    names = list(headers) or [""] * len(table.shown)
    narrowest = {(names.index(k) if isinstance(k, str) else k): n for k, n in (wrap_to or {}).items()
                 if isinstance(k, int) or k in names}
    wrapped = sorted(narrowest, key=table.size, reverse=True)
    for column in wrapped:
        if table.total() > width:
            table.wrap_column(column, max(narrowest[column], table.size(column) - (table.total() - width)))
    table.wrap_headers(width)
    for column in [names.index(name) for name in drop if name in names] + list(range(len(names) - 1, 0, -1)):
        if table.total() > width and column in table.shown:
            table.shown.remove(column)
    for column in wrapped:
        if column in table.shown and table.total() < width:
            table.wrap_column(column, table.size(column) + width - table.total())
    text = tabulate([[row[j] for j in table.shown] for row in table.rows],
                    headers=[table.headers[j] for j in table.shown] if table.headers else (), disable_numparse=True,
                    **options)
    left_out = [names[j] for j in range(len(names)) if j not in table.shown]
    if not left_out:
        return text
    return text + "\n" + wrap(f"(left out to fit {width} columns: {', '.join(left_out)}; --json has them)", width)


class Table:
    """A table's cells as text, as given and as shown (wrapped), which of its columns are shown, and their widths
    as tabulate sets them."""

    def __init__(self, rows: List[List[str]], headers: List[str]) -> None:
        self.given, self.given_headers = rows, headers
        self.rows, self.headers = [row[:] for row in rows], headers[:]
        self.shown = list(range(len(headers) or max((len(row) for row in rows), default=0)))

    def cells(self, column: int) -> int:
        return max((_widest(row[column]) for row in self.rows), default=0)

    def size(self, column: int) -> int:
        """The column's width: its widest line of a cell, or of its header beside tabulate's padding."""
        return max(self.cells(column), _widest(self.headers[column]) + PAD) if self.headers else self.cells(column)

    def total(self) -> int:
        return sum(self.size(j) for j in self.shown) + GAP * max(0, len(self.shown) - 1)

    def wrap_headers(self, width: int) -> None:
        """The headers wider than their cells over more lines, the widest first, until the table fits: each by
        words, over two lines at the most (a header of two lines reads at a glance; one of a word a line does not)
        and no narrower than its cells."""
        for j in sorted(self.shown, key=lambda j: self.size(j) - self.cells(j), reverse=True):
            over, header = self.total() - width, self.headers[j] if self.headers else ""
            if over <= 0 or not header.strip():
                continue
            two_lines = next(w for w in range(len(header) + 1) if len(_words(header, w)) <= 2)
            self.headers[j] = "\n".join(_words(header, max(self.cells(j) - PAD, two_lines, _widest(header) - over)))

    def wrap_column(self, column: int, to: int) -> None:
        """The column's cells as given, and its header, wrapped by words to ``to`` characters (a longer word cut)."""
        for given, row in zip(self.given, self.rows):
            row[column] = "\n".join(line for part in given[column].split("\n")
                                    for line in textwrap.wrap(part, to) or [""])
        if self.headers:
            self.headers[column] = "\n".join(textwrap.wrap(self.given_headers[column], max(1, to - PAD)))


def _words(text: str, width: int) -> List[str]:
    """``text``'s lines wrapped to ``width`` by its spaces alone (a word wider stays whole)."""
    return textwrap.wrap(text, max(1, width), break_long_words=False, break_on_hyphens=False)


def _widest(text: str) -> int:
    return max(map(len, text.split("\n")))
