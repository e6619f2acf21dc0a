"""What the command-line tools share: --version, argument types, the GPU check, errors on stderr,
and a quiet exit into a closed pipe."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

import torch

from ._version import __version__


def parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """An ArgumentParser with the module docstring's first line as its description, and --version."""
    # No abbreviations: a tool that looks for one option before parsing (bench's --distributed)
    # would miss a prefix of it that argparse then takes.
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0], allow_abbrev=False)
    p.add_argument("--version", action="version", version=f"linrec {__version__}")
    return p


def positive_int(text: str) -> int:
    """An argparse type: an integer above zero."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def output_path(text: str) -> str:
    """An argparse type: a file to write, in a folder that exists and is writable, so that a run
    fails at once rather than after its measurements."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder} does not exist")
    if os.path.isdir(text) or not os.access(text if os.path.exists(text) else folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}")
    return text


def cuda_unavailable(compiled_kernels: bool) -> str | None:
    """Why a tool that times or inspects GPU kernels cannot run here, or None when it can.
    compiled_kernels: it needs linrec's compiled CUDA kernels, not only a CUDA device."""
    if not torch.cuda.is_available():
        return "needs a CUDA device, and torch sees none"
    if compiled_kernels:
        import linrec

        info = linrec.build_info()
        if not info["cuda"]:
            return f"needs linrec's compiled CUDA kernels: {info['cuda_unavailable']}"
    return None


def fail(prog: str, message: str) -> int:
    """Prints `prog: error: message` on stderr, as argparse does, and returns the exit status 1."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 1


def run(main: Callable[[Sequence[str] | None], int]) -> int:
    """main(), where a reader that stops early (`python -m linrec --info | head -4`) ends the
    output quietly instead of with a BrokenPipeError traceback."""
    try:
        code = main(None)
        sys.stdout.flush()
    except BrokenPipeError:
        # The interpreter flushes stdout again at exit; aim it at devnull so that
        # flush does not fail on the closed pipe too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    return code
