"""Which third-party packages a package's module-level imports reach, read from its source (no
import, no GPU): the evidence behind carry-rules.txt's "not reached" (issue 57).

usage: python3 gpukit/payload/import_closure.py ROOT MODULE... [--prefix vllm] [--chain MODULE]
  ROOT    a folder holding the package's source (an unzipped wheel)
  MODULE  where to start (vllm.entrypoints.llm, vllm.v1.worker.gpu.model_runner, ...)
Follows `import` / `from ... import` statements at module level whose target starts with
--prefix (the package itself); an import inside a function, a `try:` or an `if` (other than
`if TYPE_CHECKING`, never taken) is not followed, since it runs only when called or when its
condition holds. Prints each third-party top-level name reached, with how many modules import it.
A lower bound of what an import needs, not an upper one: a function-level import (flashinfer in
vLLM 0.34's Qwen3.5 norms) still runs when the function does.

For 0.34.0 (the vllm and flashinfer 0.7.4 wheels unzipped into folders of your choice):
    python3 gpukit/payload/import_closure.py UNPACKED_VLLM_0.34.0 vllm.entrypoints.llm vllm.v1.engine.core \
        vllm.v1.worker.gpu_worker vllm.v1.worker.gpu.model_runner vllm.models.qwen3_5.nvidia.model \
        vllm.lora.punica_wrapper.punica_gpu vllm.v1.structured_output
    python3 gpukit/payload/import_closure.py UNPACKED_FLASHINFER_0.7.4 flashinfer --prefix flashinfer
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path


def _path(root: Path, mod: str) -> Path | None:
    p = root.joinpath(*mod.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def _imports(path: Path, mod: str) -> list[tuple[str, bool]]:
    """(imported module, conditional) for every import statement at module level."""
    out: list[tuple[str, bool]] = []
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]

    def visit(body, conditional: bool) -> None:
        for n in body:
            if isinstance(n, ast.Import):
                out.extend((a.name, conditional) for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                base = ".".join(package[: len(package) - n.level + 1] + ([n.module] if n.module else [])) \
                    if n.level else n.module
                out.append((base, conditional))
                out.extend((f"{base}.{a.name}", conditional) for a in n.names)
            elif isinstance(n, ast.Try):
                visit(n.body, True)
            elif isinstance(n, ast.If) and "TYPE_CHECKING" not in ast.unparse(n.test):
                visit(n.body, True)
                visit(n.orelse, True)

    visit(ast.parse(path.read_text()).body, False)
    return out


def closure(root: Path, starts: list[str], prefix: str) -> tuple[dict[str, set[str]], dict[str, str | None]]:
    """third-party top-level name -> modules importing it unconditionally; module -> who reached it."""
    reached: dict[str, str | None] = {}
    third: dict[str, set[str]] = defaultdict(set)
    stack: list[tuple[str, str | None]] = [(m, None) for m in starts]
    while stack:
        mod, parent = stack.pop()
        path = None if mod in reached else _path(root, mod)
        if path is None:
            continue
        reached[mod] = parent
        for target, conditional in _imports(path, mod):
            if not target or conditional:
                continue
            parts = target.split(".")
            if parts[0] == prefix:
                stack.extend((".".join(parts[:i]), mod) for i in range(1, len(parts) + 1))
            elif parts[0] not in sys.stdlib_module_names:
                third[parts[0]].add(mod)
    return third, reached


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("modules", nargs="+")
    ap.add_argument("--prefix", default="vllm")
    ap.add_argument("--chain", action="append", default=[], help="print how MODULE was reached")
    a = ap.parse_args(argv)
    third, reached = closure(a.root, a.modules, a.prefix)
    for name in sorted(third):
        print(f"{name}: {len(third[name])} modules, e.g. {sorted(third[name])[0]}")
    print(f"{len(reached)} {a.prefix} modules reached")
    for target in a.chain:
        chain = [target]
        while reached.get(chain[-1]):
            chain.append(reached[chain[-1]])
        print("chain:", " <- ".join(chain) if target in reached else f"{target} not reached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
