"""linrec's development tools: python -m tools <command> [args].

These stay in the repository and are not shipped in the wheel; the user-facing
tools are python -m linrec.bench, linrec.tune and linrec.func_attrs.
"""

import importlib
import sys

COMMANDS = {
    "generate": "tools.generate",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip() + "\n\ncommands: " + ", ".join(COMMANDS), file=sys.stderr if argv else sys.stdout)
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
