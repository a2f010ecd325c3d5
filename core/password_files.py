"""A secret handed to a management command in a file (or on standard input), never on its command line."""

import sys
from pathlib import Path


def first_line(path: str) -> str:
    """The password in the file's first line ("-": standard input), "" when there is none."""
    if path == "-":
        text = sys.stdin.read()
    else:
        text = Path(path).read_text() if Path(path).is_file() else ""
    return (text.splitlines() or [""])[0].strip()
