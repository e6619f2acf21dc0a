"""linrec's development tools: python -m tools <command> [args], from the repository root.

These stay in the repository and are not shipped in the wheel; the user-facing
tools are python -m linrec.bench, linrec.tune and linrec.func_attrs. The GPU tools
import the installed linrec (the source tree's python/ is not on the path).
"""

import ast
import importlib
import importlib.util
import sys

COMMANDS = {
    "generate": "tools.generate",
    "api-docs": "tools.api_docs",
    "check-floors": "tools.check_floors",
    "complex-bench": "tools.complex_bench",
    "config-sweep": "tools.config_sweep",
    "kernel-times": "tools.kernel_times",
    "models-bench": "tools.models_bench",
    "profile-case": "tools.profile_case",
    "readme-tables": "tools.readme_tables",
    "sanitize-cases": "tools.sanitize_cases",
    "selective-configs": "tools.selective_configs",
    "shape-sweep": "tools.shape_sweep",
    "step-profile": "tools.step_profile",
    "tests-not-run": "tools.tests_not_run",
    "throughput-grid": "tools.throughput_grid",
}
# Shell scripts beside the commands, run as bash tools/NAME.
SHELL_SCRIPTS = {
    "ab_builds.sh": "on a GPU machine: kernel times (or bench figures) of compile-time variants, one build each",
    "tune_sweep.sh": "the device tuning runs behind the tuning tables (python/linrec/tuning/)",
}


def summary(module: str) -> str:
    """The first line of a command module's docstring, read without importing it (most import torch)."""
    spec = importlib.util.find_spec(module)
    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [__doc__.strip(), "", "commands:"]
    lines += [f"  {name:<{width}}  {summary(module)}" for name, module in COMMANDS.items()]
    lines += ["", "shell scripts (bash tools/NAME):"]
    lines += [f"  {name:<{width}}  {what}" for name, what in SHELL_SCRIPTS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    asked = not argv or argv[0] in ("-h", "--help")
    if asked or argv[0] not in COMMANDS:
        if not asked:
            print(f"unknown command: {argv[0]}\n", file=sys.stderr)
        print(usage(), file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:]) or 0


if __name__ == "__main__":
    raise SystemExit(main())
