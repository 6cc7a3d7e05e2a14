"""DESIGN.md's layering rule, checked by reading the imports.

DESIGN.md ("Modules, top down") lists the core's Rust modules top down: each uses only the
modules above it, nothing in the core uses `py`, and inside a module its files follow the
same rule (no two use each other). This test reads the code, not a copy of the rule:

- the order comes from DESIGN.md's table itself, so the doc and the test cannot drift
  (a module of `src/lib.rs` missing from the table fails too);
- the Rust uses are read from the sources: the module tree from the `mod` declarations
  (from `src/lib.rs` down; `#[cfg(test)]` items and test modules left out), then every
  `use crate::...`/`super::`/`self::`/child-module path, and every `crate::`/`super::`
  path in expressions, with comments (doc comments too), strings and char literals
  blanked first. A path to a name that a module re-exports (`pub use x::Y`, or a
  private `use` that a child reaches through `super::`) is followed to the file that
  defines the name, so a `mod.rs` that re-exports its files is not a file in the middle
  of every circle;
- the Python imports of `python/ferrofeed` are read with `ast`: every `import` and
  `from ... import`, at module level, inside functions, and under `TYPE_CHECKING`.

Three checks: (a) each core module uses only modules above it in the table; (b) no core
module uses `py`; (c) no circle among files: Rust files (a file's `mod` declarations are
not uses; what a `mod.rs` calls in its files is), and Python modules. A failure names
the file, the line and the import.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PKG = ROOT / "python" / "ferrofeed"
DESIGN = ROOT / "DESIGN.md"

# --------------------------------------------------------------------------------------
# DESIGN.md's table


def design_order() -> list[str]:
    """The modules of DESIGN.md's "Modules, top down" table, top down."""
    text = DESIGN.read_text(encoding="utf-8")
    section = re.search(r"^## Modules, top down\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "DESIGN.md has no '## Modules, top down' section"
    names = re.findall(r"^\| `(\w+)` \|", section.group(1), re.M)
    assert names, "DESIGN.md's 'Modules, top down' section has no table of modules"
    assert len(set(names)) == len(names), f"a module listed twice in DESIGN.md: {names}"
    return names


# --------------------------------------------------------------------------------------
# Reading Rust


def _blank(text: str) -> str:
    """``text`` with comments, strings and char literals blanked (lines kept)."""
    out: list[str] = []
    i, n = 0, len(text)

    def keep_lines(chunk: str) -> str:
        return "".join(c if c == "\n" else " " for c in chunk)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_lines(text[i:j]))
            i = j
        elif (m := re.compile(r'b?r(#*)"').match(text, i)) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
            out.append(keep_lines(text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(keep_lines(text[i : j + 1]))
            i = j + 1
        elif c == "'" and (
            m := re.compile(r"'(?:[^'\\\n]|\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.)'").match(
                text, i
            )
        ):
            out.append(" " * (m.end() - i))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _item_end(text: str, i: int) -> int:
    """The end of the item that starts at ``i``: its ``;`` or its block's ``}``."""
    depth = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == ";" and depth == 0:
            return i + 1
        elif c == "{" and depth == 0:
            braces = 0
            while i < n:
                if text[i] == "{":
                    braces += 1
                elif text[i] == "}":
                    braces -= 1
                    if braces == 0:
                        return i + 1
                i += 1
        i += 1
    return n


_CFG_TEST = re.compile(r"#\[cfg\((?:test|all\(\s*test\b[^\]]*)\)\]")


def _without_tests(text: str) -> str:
    """Blank every item under ``#[cfg(test)]`` (or ``#[cfg(all(test, ...))]``)."""
    while m := _CFG_TEST.search(text):
        end = _item_end(text, m.end())
        chunk = text[m.start() : end]
        text = text[: m.start()] + "".join(c if c == "\n" else " " for c in chunk) + text[end:]
    return text


@dataclass
class RustFile:
    path: Path
    module: tuple[str, ...]  # crate::a::b -> ("a", "b"); lib.rs -> ()
    text: str  # blanked: no comments, strings or test items
    raw: str  # as written (same offsets)
    children: dict[str, int]  # `mod x;` declared here -> its line
    inline: list[tuple[int, int, str]]  # inline `mod x { ... }`: (start, end, name)

    def line(self, pos: int) -> int:
        return self.text.count("\n", 0, pos) + 1

    def rel(self) -> str:
        return str(self.path.relative_to(ROOT))

    def module_at(self, pos: int) -> tuple[str, ...]:
        for start, end, name in self.inline:
            if start <= pos < end:
                return (*self.module, name)
        return self.module


def _child_file(parent: Path, name: str) -> Path:
    # lib.rs and mod.rs own their folder; a.rs owns a/.
    base = parent.parent if parent.name in ("lib.rs", "mod.rs") else parent.with_suffix("")
    for candidate in (base / f"{name}.rs", base / name / "mod.rs"):
        if candidate.exists():
            return candidate
    raise AssertionError(f"{parent.relative_to(ROOT)}: mod {name}; has no file")


_MOD = re.compile(r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*([;{])", re.M)


def rust_files() -> dict[tuple[str, ...], RustFile]:
    """Every file of the crate (tests left out), by its module path, from src/lib.rs down."""
    files: dict[tuple[str, ...], RustFile] = {}
    todo: list[tuple[Path, tuple[str, ...]]] = [(SRC / "lib.rs", ())]
    while todo:
        path, module = todo.pop()
        raw = path.read_text(encoding="utf-8")
        text = _without_tests(_blank(raw))
        rf = RustFile(path, module, text, raw, {}, [])
        for m in _MOD.finditer(text):
            if m.group(2) == ";":
                rf.children[m.group(1)] = rf.line(m.start())
                todo.append((_child_file(path, m.group(1)), (*module, m.group(1))))
            else:
                rf.inline.append((m.start(), _item_end(text, m.start()), m.group(1)))
        files[module] = rf
    return files


@dataclass(frozen=True)
class Use:
    file: RustFile
    line: int
    path: tuple[str, ...]  # absolute, in the crate
    shown: str  # as written

    def where(self) -> str:
        return f"{self.file.rel()}:{self.line}: {self.shown}"


def _use_paths(tree: str) -> Iterator[str]:
    """The paths of a use tree, ``as`` kept as ``@``: ``a::{b, c::{d as e}}`` -> ``a::b``,
    ``a::c::d@e``."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree.strip()))
    brace = tree.find("{")
    if brace < 0:
        yield tree
        return
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rindex("}")]
    depth, start, parts = 0, 0, []
    for i, c in enumerate(inner):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    for part in parts:
        for sub in _use_paths(part) if part else ():
            if sub == "self" or sub.startswith("self@"):
                yield prefix.rstrip(":") + sub[4:]
            else:
                yield prefix + sub


_USE = re.compile(r"(?<![\w$])(pub(?:\([^)]*\))?\s+)?use\s+([^;]*);")
_EXPR = re.compile(r"(?<![\w$:])(crate|super|self)((?:\s*::\s*\w+)+)")


def _absolute(
    files: dict[tuple[str, ...], RustFile], base: tuple[str, ...], segs: list[str], rf: RustFile
) -> tuple[str, ...] | None:
    """``segs`` (as written in module ``base``) as a path from the crate root, or None
    when it leaves the crate (std, pyo3, ...)."""
    if not segs:
        return None
    head = segs[0]
    if head == "crate":
        return tuple(segs[1:])
    if head in ("super", "self"):
        here = list(base)
        while segs and segs[0] in ("super", "self"):
            if segs.pop(0) == "super":
                here.pop()
        return (*here, *segs)
    # A child module of this one (`use item::Item` in a mod.rs), or an inline one.
    if (*base, head) in files or any(name == head for _, _, name in rf.inline):
        return (*base, *segs)
    return None


def rust_uses(files: dict[tuple[str, ...], RustFile]) -> list[Use]:
    uses: list[Use] = []
    for rf in files.values():
        spans: list[tuple[int, int]] = []
        for m in _USE.finditer(rf.text):
            spans.append((m.start(), m.end()))
            base = rf.module_at(m.start())
            for written in _use_paths(m.group(2)):
                segs = [s for s in written.split("@")[0].split("::") if s]
                if written.startswith("::"):
                    continue
                path = _absolute(files, base, segs, rf)
                if path is None:
                    continue
                if m.group(1) and path[: len(base)] == base and len(path) > len(base):
                    # `pub use child::X`: the module's surface, not a use (a use of X
                    # through it is followed to X's file).
                    continue
                shown = "use " + written.replace("@", " as ")
                uses.append(Use(rf, rf.line(m.start()), path, shown))
        for m in _EXPR.finditer(rf.text):
            if any(a <= m.start() < b for a, b in spans):
                continue
            before = rf.text[max(0, m.start() - 4) : m.start()]
            if re.search(r"\bin\s*$", before):  # pub(in crate::x): a visibility
                continue
            written = m.group(1) + re.sub(r"\s+", "", m.group(2))
            segs = written.split("::")
            path = _absolute(files, rf.module_at(m.start()), segs, rf)
            if path is not None:
                uses.append(Use(rf, rf.line(m.start()), path, written))
    return uses


def _module_of(files: dict[tuple[str, ...], RustFile], path: tuple[str, ...]) -> tuple[str, ...]:
    """The longest prefix of ``path`` that is a file's module."""
    for k in range(len(path), -1, -1):
        if path[:k] in files:
            return path[:k]
    return ()


def _reexports(rf: RustFile, files: dict[tuple[str, ...], RustFile]) -> dict[str, tuple[str, ...]]:
    """The names a file brings in with ``use`` (public or not), to where they point."""
    out: dict[str, tuple[str, ...]] = {}
    for m in _USE.finditer(rf.text):
        if rf.module_at(m.start()) != rf.module:
            continue
        for written in _use_paths(m.group(2)):
            name, _, alias = written.partition("@")
            segs = [s for s in name.split("::") if s]
            path = _absolute(files, rf.module, segs, rf)
            if path is not None and segs and segs[-1] != "*":
                out[alias or segs[-1]] = path
    return out


def target_file(files: dict[tuple[str, ...], RustFile], path: tuple[str, ...]) -> RustFile:
    """The file that defines what ``path`` names, through re-exports."""
    seen = set()
    while True:
        module = _module_of(files, path)
        rest = path[len(module) :]
        if not rest or path in seen:
            return files[module]
        seen.add(path)
        rf = files[module]
        step = _reexports(rf, files).get(rest[0])
        if step is None or step == path[: len(module) + 1]:
            return rf
        path = (*step, *rest[1:])


Rust = tuple[dict[tuple[str, ...], RustFile], list[Use]]


@functools.cache
def _read_rust() -> Rust:
    files = rust_files()
    return files, rust_uses(files)


# --------------------------------------------------------------------------------------
# Reading Python


@dataclass(frozen=True)
class PyImport:
    module: str  # importer, e.g. "_loader"
    line: int
    target: str  # imported module of the package, e.g. "_pipeline"
    shown: str

    def where(self) -> str:
        if self.module == "_core":
            return self.shown  # the Rust file's own place
        return f"python/ferrofeed/{_py_file(self.module)}:{self.line}: {self.shown}"


def _py_file(module: str) -> str:
    return "__init__.py" if module == "__init__" else f"{module}.py"


def python_imports() -> list[PyImport]:
    modules = {p.stem for p in PKG.glob("*.py")}
    compiled = {"_core"}  # the extension: no Python imports of its own
    out: list[PyImport] = []
    for file in sorted(PKG.glob("*.py")):
        me = file.stem
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "ferrofeed":
                        target = parts[1] if len(parts) > 1 else "__init__"
                        out.append(PyImport(me, node.lineno, target, f"import {alias.name}"))
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and (node.module or "").split(".")[0] != "ferrofeed":
                    continue
                if node.level > 1:
                    raise AssertionError(f"{file}:{node.lineno}: relative import above the package")
                parts = (node.module or "").split(".")
                parts = parts[1:] if node.level == 0 else parts
                shown = "from " + "." * node.level + (node.module or "") + " import "
                if parts and parts[0]:
                    out.append(
                        PyImport(
                            me, node.lineno, parts[0], shown + ", ".join(a.name for a in node.names)
                        )
                    )
                else:  # from . import x, y / from ferrofeed import X
                    for alias in node.names:
                        known = modules | compiled
                        target = alias.name if alias.name in known else "__init__"
                        out.append(PyImport(me, node.lineno, target, shown + alias.name))
    out.extend(extension_imports())
    return [i for i in out if i.target in modules | compiled and i.target != i.module]


_PY_IMPORT = re.compile(r'import\(\s*(?:py\s*,\s*)?"ferrofeed\.(\w+)"')


def extension_imports() -> list[PyImport]:
    """The modules of the package that the extension (``_core``, ``src/py``) imports."""
    out = []
    for rf in _read_rust()[0].values():
        if rf.module[:1] != ("py",):
            continue
        for m in _PY_IMPORT.finditer(rf.raw):
            if rf.text.startswith("import", m.start()):  # code, not a comment or a test
                shown = f"{rf.rel()}:{rf.line(m.start())}: {m.group(0)}"
                out.append(PyImport("_core", rf.line(m.start()), m.group(1), shown))
    return out


# --------------------------------------------------------------------------------------
# Circles


def circles(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Every strongly connected set of more than one node, each as one circle through it.

    ``edges[a][b]`` lists the imports by which ``a`` uses ``b``.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    found = []
    for scc in sccs:
        # One shortest circle through the set's first node (breadth first inside the set).
        start, members = scc[0], set(scc)
        prev: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w in sorted(edges.get(v, {})):
                    if w in members and w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        loop = [start]
        v = prev[start]
        while v != start:
            loop.append(v)
            v = prev[v]
        found.append([start, *reversed(loop[1:])])
    return found


def _describe(loop: list[str], edges: dict[str, dict[str, list[str]]]) -> str:
    lines = [" -> ".join([*loop, loop[0]])]
    for a, b in zip(loop, [*loop[1:], loop[0]], strict=True):
        lines.extend(f"    {w}" for w in edges[a][b])
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# The checks


@pytest.fixture
def rust() -> Rust:
    return _read_rust()


def test_every_module_of_the_crate_is_in_designs_table(
    rust: Rust,
) -> None:
    files, _ = rust
    declared = {k[0] for k in files if len(k) == 1}
    order = design_order()
    assert order[-1] == "py", "DESIGN.md's table ends with the bindings, `py`"
    assert declared - set(order) == set(), (
        f"modules of src/lib.rs missing from DESIGN.md's table: {sorted(declared - set(order))}"
    )
    assert set(order) - declared == set(), (
        f"DESIGN.md's table lists modules src/lib.rs lacks: {sorted(set(order) - declared)}"
    )


def test_each_core_module_uses_only_modules_above_it_in_design(
    rust: Rust,
) -> None:
    _, uses = rust
    order = design_order()
    rank = {m: i for i, m in enumerate(order)}
    bad = []
    for use in uses:
        if not use.file.module or not use.path:
            continue
        me, other = use.file.module[0], use.path[0]
        if me == other or me == "py" or other not in rank or me not in rank:
            continue
        if other == "py":
            continue  # test_no_core_module_uses_py
        if rank[other] > rank[me]:
            bad.append(f"{use.where()}  (`{me}` uses `{other}`, listed below it)")
    assert not bad, "DESIGN.md's order (Modules, top down) broken:\n" + "\n".join(bad)


def test_no_core_module_uses_py(rust: Rust) -> None:
    _, uses = rust
    bad = [
        use.where() for use in uses if use.file.module[:1] != ("py",) and use.path[:1] == ("py",)
    ]
    assert not bad, "the core uses the bindings (`py`):\n" + "\n".join(bad)


def rust_file_edges(
    files: dict[tuple[str, ...], RustFile], uses: list[Use]
) -> dict[str, dict[str, list[str]]]:
    edges: dict[str, dict[str, list[str]]] = {}
    for use in uses:
        target = target_file(files, use.path)
        if target is not use.file:
            edges.setdefault(use.file.rel(), {}).setdefault(target.rel(), []).append(use.where())
    return edges


def test_no_circle_among_rust_files(
    rust: Rust,
) -> None:
    edges = rust_file_edges(*rust)
    found = circles(edges)
    assert not found, "circles among Rust files:\n" + "\n".join(
        _describe(loop, edges) for loop in found
    )


def python_edges() -> dict[str, dict[str, list[str]]]:
    edges: dict[str, dict[str, list[str]]] = {}
    for imp in python_imports():
        edges.setdefault(imp.module, {}).setdefault(imp.target, []).append(imp.where())
    return edges


def test_no_circle_among_python_modules() -> None:
    edges = python_edges()
    found = circles(edges)
    assert not found, "circles among the modules of python/ferrofeed:\n" + "\n".join(
        _describe(loop, edges) for loop in found
    )


# --------------------------------------------------------------------------------------
# The reader itself


def test_the_reader_sees_uses_in_every_form_and_nothing_in_comments_strings_or_tests() -> None:
    assert list(_use_paths("super::{a, b::{c as d, self}}")) == [
        "super::a",
        "super::b::c@d",
        "super::b",
    ]
    text = _without_tests(
        _blank(
            "/// crate::doc::x\n"
            'let s = "crate::string::x"; let c = \'"\';\n'
            "#[cfg(test)]\nmod tests { use crate::tested::x; }\n"
            "let v = crate::used::x(); // crate::comment::x\n"
        )
    )
    assert [m.group(0) for m in _EXPR.finditer(text)] == ["crate::used::x"]
    assert text.count("\n") == 5  # lines kept: failures name the right one


def test_the_circles_are_found_and_shown_with_their_imports() -> None:
    edges = {
        "a": {"b": ["a.py:1: import b"]},
        "b": {"c": ["b.py:2: import c"]},
        "c": {"a": ["c.py:3: import a"]},
    }
    (loop,) = circles(edges)
    assert loop == ["a", "b", "c"]
    assert _describe(loop, edges).splitlines()[0] == "a -> b -> c -> a"
    assert circles({"a": {"b": []}, "b": {}}) == []
