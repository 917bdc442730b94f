"""`ctxprec sample PATH`: write the bundled sample (12 retrieval-log rows, the README's main
job) where the user asks, so an installed ctxprec can run its main job from any folder:
`ctxprec sample sample.parquet && ctxprec score sample.parquet -o out/sample`. The one copy is
package data (pipeline/data/sample.parquet; the checkout's examples/sample.parquet links to it).
"""

from __future__ import annotations

import argparse
import os
from importlib import resources
from pathlib import Path
from typing import Any

from ctxprec.storage.core.errors import OutputError
from ctxprec.storage.core.seams import DEFAULT, Seams

__all__ = ["add_sample_command", "run_sample_command", "sample_bytes"]

SAMPLE_NAME = "sample.parquet"  # in the package's data folder; the default name in a folder


def sample_bytes() -> bytes:
    """The bundled sample Parquet file, as shipped in the installed package."""
    return (resources.files("ctxprec") / "data" / SAMPLE_NAME).read_bytes()


def add_sample_command(sub: Any) -> None:
    sa = sub.add_parser(
        "sample",
        help="write the bundled sample input to PATH (ctxprec sample sample.parquet)",
        description="Write the 12-row sample the README scores (query, expected output, "
        "contexts, labels) to PATH, then: ctxprec score PATH -o out/sample. An existing file "
        "is never replaced.",
    )
    sa.add_argument("path", type=Path, metavar="PATH", help="where to write it (a .parquet file)")


def run_sample_command(args: argparse.Namespace, seams: Seams = DEFAULT) -> int:
    path: Path = args.path
    if path.is_dir():
        path = path / SAMPLE_NAME
    data = sample_bytes()
    try:  # O_EXCL: a file already there (the user's own, or a link) is left as it is
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise OutputError(f"{path} already exists; ctxprec sample never replaces a file: "
                          "name another path or remove it") from None  # fmt: skip
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    print(f"ctxprec: wrote the sample ({len(data):,} bytes) to {path}; score it with: "
          f"ctxprec score {path} -o out/sample")  # fmt: skip
    return 0
