"""The dependency direction capability <- runtime <- backends/*, read from the source's imports.

A vendor folder imports only the public backend API and ``backends/triton``, never another
vendor; capability imports nothing else of quantrt; the runtime never imports a backend
(backends arrive through entry points).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"runtime": "quantrt", "capability": "quantrt.capability", "backends": "quantrt.backends"}
VENDORS = ("cuda", "rocm", "cpu", "xpu")
BACKEND_API = (
    "quantrt.kernels",
    "quantrt.prepared",
    "quantrt.packing",
    "quantrt.gguf_blocks",
    "quantrt.schemes",
    "quantrt.capability",
    "quantrt.canonical",
    "quantrt.moe",
    "quantrt.kv",
    "quantrt.reference.turboquant",
    "quantrt.specs",
    "quantrt.torchops",
    "quantrt.backends.triton",
)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    base = FOLDERS[rel.parts[0]]
    parts = [p for p in rel.parts[1:]]
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([base, *parts])


def imports_of(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of the quantrt modules a source file imports."""
    found: set[str] = set()
    pkg = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {n for n in found if n == "quantrt" or n.startswith("quantrt.")}


def violations(module: str, imported: set[str]) -> list[str]:
    bad = []
    for name in sorted(imported):
        if module.startswith("quantrt.capability"):
            if not name.startswith("quantrt.capability"):
                bad.append(f"{module} imports {name}: capability must not import the rest of quantrt")
        elif module.startswith("quantrt.backends."):
            vendor = module.split(".")[2]
            own = f"quantrt.backends.{vendor}"
            if name.startswith(own) or any(name == a or name.startswith(a + ".") for a in BACKEND_API):
                continue
            other = (
                name.split(".")[2] if name.startswith("quantrt.backends.") and name.count(".") >= 2 else None
            )
            if other in VENDORS:
                bad.append(f"{module} imports {name}: a vendor folder must not import another vendor's")
            elif name != "quantrt.backends":
                bad.append(f"{module} imports {name}: backends use only the public backend API {BACKEND_API}")
        elif module.startswith("quantrt") and not module.startswith("quantrt.backends"):
            if name.startswith("quantrt.backends"):
                bad.append(f"{module} imports {name}: the runtime loads backends through entry points only")
    return bad


def test_checker_flags_violations() -> None:
    assert violations("quantrt.capability.cpu", {"quantrt.dispatch"})
    assert violations("quantrt.backends.cuda.x", {"quantrt.backends.rocm.torch_ops"})
    assert violations("quantrt.backends.cpu.x", {"quantrt.layers"})
    assert violations("quantrt.dispatch", {"quantrt.backends.cuda"})
    assert not violations("quantrt.backends.cuda.x", {"quantrt.kernels", "quantrt.backends.triton.w4"})
    src = "from ...rocm import torch_ops\nfrom quantrt.kernels import Kernel\n"
    got = imports_of(src, "quantrt.backends.cuda.sub.mod", is_package=False)
    assert "quantrt.backends.rocm" in got


def test_import_direction() -> None:
    files = [p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")]
    assert len(files) > 20
    problems = []
    for path in files:
        mod = module_name(path)
        problems += violations(mod, imports_of(path.read_text(), mod, path.name == "__init__.py"))
    assert not problems, "\n".join(problems)
