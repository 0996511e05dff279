"""How every benchmark reports: the summary JSON on stdout, and in $OUT/<name> when OUT is set
(the GPU machine's results folder)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path


def emit(summary: dict, name: str) -> str:
    """Print ``summary`` as indented JSON and write it to ``$OUT/<name>``; return the text."""
    text = json.dumps(summary, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], name).write_text(text + "\n")
    return text


def read_text(path: Path) -> str:
    """A text file's contents, gunzipped when its name ends in ``.gz`` (the metrics files kept
    under ``results/`` are stored gzipped: every device call carries the working tree)."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode()
    return path.read_text()
