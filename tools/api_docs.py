"""docs/api.md from linrec's signatures and docstrings (--check: exit 1 if the file is stale).

python -m tools api-docs            writes docs/api.md
python -m tools api-docs --check    compares it with what would be written, prints a diff

It imports linrec (the installed package, or python/ on PYTHONPATH) and the modules listed in
SECTIONS. The output depends only on names, signatures and docstrings: no addresses, no
build-dependent values, members in a fixed order (a module's __all__, else its public functions
in source order).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "api.md"

# (module, members or None for the module's public names, what the section is for)
SECTIONS = [
    ("linrec", ["linrec", "selective_scan", "build_info", "compiled_configs"],
     "The recurrence, Mamba's selective scan and what the installed build holds."),
    ("linrec.distributed", None, "One sequence sharded along its length across the ranks of a process group."),
    ("linrec.models", None, "Layers built on linrec.linrec, and the selective scan."),
    ("linrec.impl.python", None, "Reference implementations in plain PyTorch (any device)."),
    ("linrec.impl.cuda", None, "One function per compiled CUDA kernel family (CUDA tensors)."),
    ("linrec.impl.triton", None, "The Triton implementations (CUDA tensors)."),
]

HEADER = """\
# API reference

Generated from the signatures and docstrings by `python -m tools api-docs`; do not edit by hand
(`python -m tools api-docs --check`, run by `tests/test_docs.py`, fails when this file is stale).
The guide to the same functions, with examples, is [usage.md](usage.md).
"""

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def public_members(module) -> list[str]:
    """The module's __all__, else its public functions and classes defined in it, in source order."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)

    def defined_here(obj):
        return (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", None) == module.__name__

    members = [(name, obj) for name, obj in vars(module).items() if not name.startswith("_") and defined_here(obj)]
    return [name for name, obj in sorted(members, key=lambda item: _source_line(item[1]))]


def _source_line(obj) -> int:
    try:
        return inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return 1 << 30


def format_default(value) -> str:
    """A default value as source-like text, without memory addresses (torch.tanh, not <built-in ... at 0x..>)."""
    if inspect.isroutine(value) or inspect.isclass(value):
        module = getattr(value, "__module__", None) or ""
        if module.startswith("torch._C"):
            module = "torch"
        name = getattr(value, "__name__" if inspect.isbuiltin(value) else "__qualname__", None) or repr(value)
        return _ADDRESS.sub("", f"{module}.{name}" if module and module != "builtins" else name)
    return _ADDRESS.sub("", repr(value))


def format_annotation(annotation) -> str:
    if isinstance(annotation, str):
        return annotation
    return _ADDRESS.sub("", inspect.formatannotation(annotation))


def format_signature(name: str, obj) -> str:
    """name(params) -> return, with annotations as written (strings under `from __future__ import annotations`)."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params, seen_keyword_only, previous = [], False, None
    for p in signature.parameters.values():
        if previous == p.POSITIONAL_ONLY and p.kind != p.POSITIONAL_ONLY:
            params.append("/")
        if p.kind == p.KEYWORD_ONLY and not seen_keyword_only:
            params.append("*")
        if p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL):
            seen_keyword_only = True
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.annotation is not p.empty:
            text += f": {format_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {format_default(p.default)}" if p.annotation is not p.empty else f"={format_default(p.default)}"
        params.append(text)
        previous = p.kind
    if previous == inspect.Parameter.POSITIONAL_ONLY:
        params.append("/")
    result = f"{name}({', '.join(params)})"
    if signature.return_annotation is not signature.empty:
        result += f" -> {format_annotation(signature.return_annotation)}"
    return result


def docstring_block(obj) -> list[str]:
    """The docstring as a text block (it is plain text, with its own indentation and layout)."""
    doc = inspect.getdoc(obj) if obj is not None else None
    if not doc:
        return ["*(no docstring)*", ""]
    lines = [line.rstrip() for line in doc.strip().splitlines()]
    fence = "```"
    while any(line.lstrip().startswith(fence) for line in lines):  # a docstring with its own fences
        fence += "`"
    return [f"{fence}text", *lines, fence, ""]


def own_doc(obj):
    """obj's own docstring, not one inherited from a base class (nn.Module's, say)."""
    return obj if obj.__dict__.get("__doc__") else None


def class_methods(cls) -> list[tuple[str, object]]:
    """Public methods defined on the class itself (forward, say), in source order."""
    methods = [(name, obj) for name, obj in vars(cls).items()
               if not name.startswith("_") and inspect.isfunction(obj)]
    return sorted(methods, key=lambda item: _source_line(item[1]))


def render_member(module_name: str, name: str, obj) -> list[str]:
    qualified = f"{module_name}.{name}"
    if inspect.isclass(obj):
        lines = [f"### class `{qualified}`", "", "```python", format_signature(qualified, obj), "```", ""]
        lines += docstring_block(own_doc(obj))
        for method_name, method in class_methods(obj):
            lines += [f"#### `{name}.{method_name}`", "", "```python",
                      format_signature(method_name, method).replace("(self, ", "(", 1).replace("(self)", "()", 1),
                      "```", ""]
            if inspect.getdoc(method) and method.__doc__:
                lines += docstring_block(method)
        return lines
    if callable(obj):
        return [f"### `{qualified}`", "", "```python", format_signature(qualified, obj), "```", "",
                *docstring_block(obj)]
    return [f"### `{qualified}`", "", f"`{_ADDRESS.sub('', repr(obj))}`", ""]


def anchor(module_name: str) -> str:
    return module_name.replace(".", "")


def render() -> str:
    modules = [(importlib.import_module(name), members, what) for name, members, what in SECTIONS]
    lines = [HEADER.strip(), "", "## Contents", ""]
    for module, members, what in modules:
        names = members if members is not None else public_members(module)
        lines.append(f"- [`{module.__name__}`](#{anchor(module.__name__)}): {what} "
                     + ", ".join(f"`{name}`" for name in names))
    lines.append("")
    for module, members, what in modules:
        names = members if members is not None else public_members(module)
        lines += [f"## {module.__name__}", "", what, "", *docstring_block(module)]
        for name in names:
            lines += render_member(module.__name__, name, getattr(module, name))
    text = "\n".join(line.rstrip() for line in lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools api-docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md differs from what would be written")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write (default docs/api.md)")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current == text:
            print(f"{args.output}: up to date")
            return 0
        diff = difflib.unified_diff(current.splitlines(keepends=True), text.splitlines(keepends=True),
                                    str(args.output), "generated")
        sys.stdout.writelines(diff)
        print(f"\n{args.output} is stale: run python -m tools api-docs", file=sys.stderr)
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
