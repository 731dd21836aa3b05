#!/usr/bin/env python3
"""budgets.py: checks the code budgets of the workspace crates' Rust sources.

  (a) no non-test .rs file over 650 lines in gateway/src, mcp-front/src, auth/src and sim/src (a file's
      lines minus its #[cfg(test)] modules, attribute line to closing brace or `mod tests;`;
      *_tests.rs and tests.rs are test files and are not counted). Not yet applied to the other
      crates: some files of log-store and bench are over it (--report marks them);
  (b) no fn item over 70 lines (attribute-free `fn` line to closing brace) in the src/ of every
      workspace crate (log-store, mcp-front, gateway, bench, auth, cluster, sim);
      functions in #[cfg(test)] modules, in test files and marked #[test] / #[cfg(test)] are
      exempt; body-less declarations (`fn x(&self);`) are not functions;
  (d) no type in gateway/src with more than 800 lines of non-test functions in all its inherent
      `impl` blocks together, whatever files hold them (a type being divided may be given a
      ceiling of its own in TYPE_METHOD_LINES_CEILING that may only go down; none today;
      --report lists every crate's largest types);
  (c) the `unsafe` keyword only under gateway/src/uring/, in gateway/src/sys.rs, in
      log-store/src/mmap.rs and in sim/src/whole/ring.rs (the src/ of every workspace crate is checked, every .rs file,
      tests included; comments, strings and words like `unsafe_code` do not count).

It does not compile or expand anything: a small Rust lexer (strings, raw strings, byte and C
strings, char literals vs lifetimes, nested block comments) feeds a brace matcher. Missing
directories are skipped. Exit 1 with one line per violation (path:line: what, measured vs
budget), 0 otherwise; a one-line summary either way.

Usage: python3 scripts/budgets.py [--root DIR] [--report] [--self-test]
  --report     also print the 15 largest files and 15 longest functions; never fails
  --self-test  run the parser's built-in checks on inline Rust samples, then exit
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass

FILE_LINES_MAX = 650
FN_LINES_MAX = 70
# (d) Lines of non-test functions in all the inherent `impl` blocks of one type (per crate,
# over all its files): a type that does everything is one type however many files hold it.
TYPE_METHOD_LINES_MAX = 800
# Where (d) applies (the issue's target is the gateway's types; --report lists every crate's).
TYPE_BUDGET_DIRS = ("gateway/src",)
# Types over (d) while they are being divided: today's count is the ceiling, lowered as parts
# leave them; they may not grow. None today: gateway's `Core` came under the budget (issue 22)
# once its connections, MCP front, cluster mode, subscribers and held answers became parts.
TYPE_METHOD_LINES_CEILING: dict = {}
# Every workspace member's sources (Cargo.toml `members`; fuzz is outside the workspace).
SOURCE_DIRS = (
    "log-store/src", "mcp-front/src", "gateway/src", "bench/src", "auth/src", "cluster/src", "sim/src",
)
# Rule (a) covers these only, until the larger files of log-store and bench are split.
FILE_BUDGET_DIRS = ("gateway/src/", "mcp-front/src/", "auth/src/", "sim/src/")
UNSAFE_ALLOWED_PREFIXES = ("gateway/src/uring/",)
# log-store/src/mmap.rs: the mapping of segment files (ARCHITECTURE.md: "all `unsafe` is in
# mmap.rs"); every other log-store module is #![forbid(unsafe_code)].
# sim/src/whole/ring.rs: the simulated kernel executes the driver's operations (`uring::Sqe`)
# on the raw pointers the `Ring` seam hands it, under the same contract as io_uring.
UNSAFE_ALLOWED_FILES = ("gateway/src/sys.rs", "log-store/src/mmap.rs", "sim/src/whole/ring.rs")
UNSAFE_WHERE = ("gateway/src/uring/, gateway/src/sys.rs, log-store/src/mmap.rs and "
                "sim/src/whole/ring.rs")
REPORT_TOP = 15


# ---------------------------------------------------------------------------------------------
# Lexer: only what the brace matcher and the item scan need. Comments are dropped; string, char
# and byte literals become one "lit" token; lifetimes one "lifetime" token.


@dataclass(frozen=True)
class Tok:
    kind: str  # "ident", "punct", "lit", "lifetime"
    text: str
    line: int  # 1-based line where the token starts


class LexError(Exception):
    pass


def _is_ident_start(c: str) -> bool:
    return c.isalpha() or c == "_"


def _is_ident_char(c: str) -> bool:
    return c.isalnum() or c == "_"


def lex(src: str) -> list[Tok]:
    toks: list[Tok] = []
    i, n, line = 0, len(src), 1

    def skip_quoted(j: int, quote: str) -> int:
        """j is just past the opening quote; returns the index just past the closing one."""
        nonlocal line
        while j < n:
            c = src[j]
            if c == "\\":
                if j + 1 < n and src[j + 1] == "\n":
                    line += 1
                j += 2
                continue
            if c == "\n":
                line += 1
            elif c == quote:
                return j + 1
            j += 1
        raise LexError(f"unterminated literal starting on line {start_line}")

    def skip_raw(j: int) -> int:
        """j is at the first '#' or '"' after the r prefix; returns the index past the end."""
        nonlocal line
        hashes = 0
        while j < n and src[j] == "#":
            hashes += 1
            j += 1
        if j >= n or src[j] != '"':
            raise LexError(f"bad raw string on line {start_line}")
        close = '"' + "#" * hashes
        end = src.find(close, j + 1)
        if end < 0:
            raise LexError(f"unterminated raw string starting on line {start_line}")
        line += src.count("\n", j, end)
        return end + len(close)

    while i < n:
        c = src[i]
        start_line = line
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif src.startswith("//", i):
            end = src.find("\n", i)
            i = n if end < 0 else end
        elif src.startswith("/*", i):
            depth, i = 1, i + 2  # Rust block comments nest
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        line += 1
                    i += 1
            if depth:
                raise LexError(f"unterminated block comment starting on line {start_line}")
        elif c == '"':
            i = skip_quoted(i + 1, '"')
            toks.append(Tok("lit", '""', start_line))
        elif c == "'":
            # A char literal ('x', '\n', '\u{7b}', '{') or a lifetime / label ('a, 'static).
            if i + 1 < n and src[i + 1] == "\\":
                i = skip_quoted(i + 1, "'")
                toks.append(Tok("lit", "''", start_line))
            elif i + 2 < n and src[i + 2] == "'" and src[i + 1] != "\n":
                i += 3
                toks.append(Tok("lit", "''", start_line))
            elif i + 1 < n and _is_ident_start(src[i + 1]):
                j = i + 1
                while j < n and _is_ident_char(src[j]):
                    j += 1
                toks.append(Tok("lifetime", src[i:j], start_line))
                i = j
            else:
                # One non-ASCII char needing more than one code unit does not occur in Python
                # strings (code points), so anything else is malformed.
                raise LexError(f"stray quote on line {start_line}")
        elif _is_ident_start(c):
            j = i
            while j < n and _is_ident_char(src[j]):
                j += 1
            word = src[i:j]
            nxt = src[j] if j < n else ""
            if word in ("r", "br", "cr") and nxt == '"':
                i = skip_raw(j)
                toks.append(Tok("lit", 'r""', start_line))
            elif word in ("r", "br", "cr") and nxt == "#":
                k = j
                while k < n and src[k] == "#":
                    k += 1
                if k < n and src[k] == '"':
                    i = skip_raw(j)
                    toks.append(Tok("lit", 'r#""#', start_line))
                elif word == "r" and k == j + 1 and k < n and _is_ident_start(src[k]):
                    m = k  # raw identifier r#name: the name, never a keyword
                    while m < n and _is_ident_char(src[m]):
                        m += 1
                    toks.append(Tok("ident", "r#" + src[k:m], start_line))
                    i = m
                else:
                    toks.append(Tok("ident", word, start_line))
                    i = j
            else:  # b"..", c"..", b'.': the prefix is an ident, the literal follows as above
                toks.append(Tok("ident", word, start_line))
                i = j
        elif c.isdigit():
            j = i + 1
            while j < n and (_is_ident_char(src[j]) or (src[j] == "." and j + 1 < n and src[j + 1].isdigit())):
                j += 1
            toks.append(Tok("lit", src[i:j], start_line))
            i = j
        else:
            two = src[i : i + 2]
            if two in ("->", "=>", "::"):
                toks.append(Tok("punct", two, start_line))
                i += 2
            else:
                toks.append(Tok("punct", c, start_line))
                i += 1
    return toks


# ---------------------------------------------------------------------------------------------
# Structure: matching braces, attributes, fn items, #[cfg(test)] modules.

OPEN = {"{": "}", "(": ")", "[": "]"}


def match_delims(toks: list[Tok]) -> dict[int, int]:
    """Index of every opening {, ( or [ -> index of its closing partner."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for k, t in enumerate(toks):
        if t.kind != "punct":
            continue
        if t.text in OPEN:
            stack.append(k)
        elif t.text in ("}", ")", "]"):
            if not stack or OPEN[toks[stack[-1]].text] != t.text:
                raise LexError(f"unbalanced {t.text!r} on line {t.line}")
            pairs[stack.pop()] = k
    if stack:
        t = toks[stack[-1]]
        raise LexError(f"unclosed {t.text!r} from line {t.line}")
    return pairs


def attributes_before(toks: list[Tok], closer_to_opener: dict[int, int], k: int) -> tuple[list[list[Tok]], int]:
    """The outer attributes (#[...]) right before token k, skipping visibility and qualifiers
    (pub(crate), const, async, unsafe, extern "C", default); returns them and the index of the
    item's first token. closer_to_opener maps each closing ) ] } to its opener."""
    qualifiers = {"pub", "const", "async", "unsafe", "extern", "default", "safe"}
    j = k - 1
    first = k
    while j >= 0:
        t = toks[j]
        if t.kind == "ident" and t.text in qualifiers:
            first = j
            j -= 1
        elif t.kind == "lit" and t.text == '""' and j > 0 and toks[j - 1].text == "extern":
            first = j
            j -= 1
        elif t.text == ")" and j in closer_to_opener and closer_to_opener[j] > 0 and toks[closer_to_opener[j] - 1].text == "pub":
            j = closer_to_opener[j] - 1  # pub(crate), pub(super), pub(in path)
        else:
            break
    attrs: list[list[Tok]] = []
    while j >= 0 and toks[j].text == "]" and j in closer_to_opener:
        o = closer_to_opener[j]
        if o == 0 or toks[o - 1].text != "#":
            break
        attrs.append(toks[o + 1 : j])
        first = o - 1
        j = o - 2
    return attrs, first


def is_test_attr(attr: list[Tok]) -> bool:
    """#[test], #[cfg(test)], #[cfg(all(test, ...))] and the like; not #[cfg(not(test))]."""
    words = [t.text for t in attr if t.kind == "ident"]
    if words == ["test"] or (words and words[-1] == "test" and "::" in [t.text for t in attr]):
        return True  # #[test], #[tokio::test]
    return (bool(words) and words[0] == "cfg" and "test" in words
            and "not" not in words and "any" not in words)


@dataclass
class Fn:
    name: str
    line: int  # line of the `fn` keyword
    end_line: int  # line of the closing brace
    test: bool  # exempt: in a test module or marked as a test
    owner: str | None = None  # the type of the inherent `impl` block it is in, if any

    @property
    def lines(self) -> int:
        return self.end_line - self.line + 1


@dataclass
class Parsed:
    total_lines: int
    test_module_lines: int  # lines of #[cfg(test)] modules (attribute to closing brace)
    fns: list[Fn]
    unsafe_lines: list[int]

    @property
    def non_test_lines(self) -> int:
        return self.total_lines - self.test_module_lines


def inherent_impls(toks: list[Tok], pairs: dict[int, int]) -> list[tuple[int, int, str]]:
    """The inherent `impl` blocks (not `impl Trait for T`): (opening brace, closing brace, the
    type's last path segment)."""
    out = []
    for k, t in enumerate(toks):
        if not (t.kind == "ident" and t.text == "impl"):
            continue
        j, angle, name, trait, where = k + 1, 0, None, False, False
        while j < len(toks):
            s = toks[j].text
            if s == "<":
                angle += 1
            elif s == ">":
                angle = max(0, angle - 1)
            elif s in ("(", "["):
                j = pairs[j]
            elif s == "{" and angle == 0:
                break
            elif s == ";" or s == "}":
                j = None
                break
            elif angle == 0 and toks[j].kind == "ident" and not where:
                if s == "for":
                    trait = True
                elif s == "where":
                    where = True
                elif s not in ("dyn", "mut", "const", "unsafe"):
                    name = s
            j += 1
        if j is None or j >= len(toks) or trait or name is None:
            continue
        out.append((j, pairs[j], name))
    return out


def parse(src: str) -> Parsed:
    toks = lex(src)
    pairs = match_delims(toks)
    openers = {c: o for o, c in pairs.items()}

    # #[cfg(test)] modules: token ranges [attribute start, closing brace or ';'].
    test_ranges: list[tuple[int, int]] = []  # grows below with the bodies of test fns
    for k, t in enumerate(toks):
        if t.kind == "ident" and t.text == "mod" and k + 2 < len(toks) and toks[k + 1].kind == "ident":
            attrs, first = attributes_before(toks, openers, k)
            if not any(is_test_attr(a) for a in attrs):
                continue
            body = k + 2
            if toks[body].text == "{":
                test_ranges.append((first, pairs[body]))
            elif toks[body].text == ";":
                test_ranges.append((first, body))

    def in_test_module(k: int) -> bool:  # or in a test fn's body
        return any(a <= k <= b for a, b in test_ranges)

    test_lines: set[int] = set()  # a set: a test module nested in another counts once
    for a, b in test_ranges:
        test_lines.update(range(toks[a].line, toks[b].line + 1))

    impls = inherent_impls(toks, pairs)
    fns: list[Fn] = []
    for k, t in enumerate(toks):
        if not (t.kind == "ident" and t.text == "fn" and k + 1 < len(toks) and toks[k + 1].kind == "ident"):
            continue  # `fn(u8) -> u8` pointer types and `fn $name` in macro_rules! are not items
        # The signature ends at the first `{` (body) or `;` (declaration) outside (), [] and <>.
        j, angle = k + 2, 0
        body = None
        while j < len(toks):
            s = toks[j].text
            if s in ("(", "["):
                j = pairs[j] + 1
                continue
            if s == "<":
                angle += 1
            elif s == ">":
                angle = max(0, angle - 1)
            elif s == "{" and angle == 0:
                body = j
                break
            elif s == ";" and angle == 0:
                break
            elif s == "{":  # const-generic block inside <...>
                j = pairs[j] + 1
                continue
            elif s == "}":
                break  # malformed: end of an enclosing block
            j += 1
        if body is None:
            continue
        attrs, _ = attributes_before(toks, openers, k)
        test = in_test_module(k) or any(is_test_attr(a) for a in attrs)
        if test:  # fns nested in a test fn come later in token order: exempt them too
            test_ranges.append((k, pairs[body]))
        owner = next((name for a, b, name in impls if a < k < b), None)
        fns.append(Fn(toks[k + 1].text, t.line, toks[pairs[body]].line, test, owner))

    unsafe_lines = sorted({t.line for t in toks if t.kind == "ident" and t.text == "unsafe"})
    return Parsed(len(src.splitlines()), len(test_lines), fns, unsafe_lines)


# ---------------------------------------------------------------------------------------------
# The checks over the tree.


def is_test_file(rel: str) -> bool:
    base = os.path.basename(rel)
    return base == "tests.rs" or base.endswith("_tests.rs")


def file_budgeted(rel: str) -> bool:
    return rel.startswith(FILE_BUDGET_DIRS)


def unsafe_allowed(rel: str) -> bool:
    return rel.startswith(UNSAFE_ALLOWED_PREFIXES) or rel in UNSAFE_ALLOWED_FILES


def rust_files(root: str) -> list[str]:
    out = []
    for d in SOURCE_DIRS:
        top = os.path.join(root, d)
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith(".rs"):
                    out.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return out


def check(root: str, report: bool, out=sys.stdout) -> int:
    files = rust_files(root)
    violations: list[str] = []
    sizes: list[tuple[int, str]] = []
    fns: list[tuple[int, str, Fn]] = []
    counts = {"a": 0, "b": 0, "c": 0, "d": 0, "parse": 0}
    type_lines: dict[tuple[str, str], int] = {}
    for rel in files:
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            src = f.read()
        try:
            p = parse(src)
        except LexError as e:
            violations.append(f"{rel}:1: cannot parse ({e}); fix the file or this script")
            counts["parse"] += 1
            continue
        if not unsafe_allowed(rel):
            for ln in p.unsafe_lines:
                violations.append(
                    f"{rel}:{ln}: `unsafe` outside {UNSAFE_WHERE} (budget: 0 here)"
                )
                counts["c"] += 1
        if is_test_file(rel):
            continue
        sizes.append((p.non_test_lines, rel))
        if file_budgeted(rel) and p.non_test_lines > FILE_LINES_MAX:
            violations.append(
                f"{rel}:1: file has {p.non_test_lines} non-test lines, budget {FILE_LINES_MAX}"
            )
            counts["a"] += 1
        for fn in p.fns:
            if fn.test:
                continue
            fns.append((fn.lines, rel, fn))
            if fn.owner is not None and (report or rel.startswith(TYPE_BUDGET_DIRS)):
                key = (rel.split("/")[0], fn.owner)
                type_lines[key] = type_lines.get(key, 0) + fn.lines
            if fn.lines > FN_LINES_MAX:
                violations.append(f"{rel}:{fn.line}: fn {fn.name} is {fn.lines} lines, budget {FN_LINES_MAX}")
                counts["b"] += 1

    for (crate, name), n in sorted(type_lines.items()):
        budget = TYPE_METHOD_LINES_CEILING.get((crate, name), TYPE_METHOD_LINES_MAX)
        if n > budget and f"{crate}/src".startswith(TYPE_BUDGET_DIRS):
            violations.append(f"{crate}: type {name} has {n} lines of inherent methods, budget {budget}")
            counts["d"] += 1
        elif (crate, name) in TYPE_METHOD_LINES_CEILING and n < budget - 50:
            print(f"budgets: note: {crate} {name} is at {n} lines of inherent methods: lower its "
                  f"ceiling ({budget}) in TYPE_METHOD_LINES_CEILING", file=out)

    if report:
        print(f"== {REPORT_TOP} types with the most lines of inherent methods "
              f"(budget {TYPE_METHOD_LINES_MAX})", file=out)
        for (crate, name), n in sorted(type_lines.items(), key=lambda x: -x[1])[:REPORT_TOP]:
            mark = "  OVER" if n > TYPE_METHOD_LINES_MAX else ""
            print(f"{n:6d}  {crate} {name}{mark}", file=out)
        print(f"== {REPORT_TOP} largest non-test files (budget {FILE_LINES_MAX} lines)", file=out)
        for n, rel in sorted(sizes, key=lambda x: (-x[0], x[1]))[:REPORT_TOP]:
            mark = ""
            if n > FILE_LINES_MAX:
                mark = "  OVER" if file_budgeted(rel) else "  (over; rule (a) not applied here yet)"
            print(f"{n:6d}  {rel}{mark}", file=out)
        print(f"== {REPORT_TOP} longest functions (budget {FN_LINES_MAX} lines)", file=out)
        for n, rel, fn in sorted(fns, key=lambda x: (-x[0], x[1], x[2].line))[:REPORT_TOP]:
            mark = "  OVER" if n > FN_LINES_MAX else ""
            print(f"{n:6d}  {rel}:{fn.line}  fn {fn.name}{mark}", file=out)
        print("== violations", file=out)
    for v in violations:
        print(v, file=out)
    summary = (f"{len(files)} files, {len(fns)} non-test functions checked; "
               f"{counts['a']} over-long files, {counts['b']} over-long functions, "
               f"{counts['c']} misplaced unsafe, {counts['d']} types over their method budget" + (f", {counts['parse']} unparsable" if counts["parse"] else ""))
    if violations:
        print(f"budgets: FAILED, {len(violations)} violations: {summary}", file=out)
        return 0 if report else 1
    print(f"budgets: ok: {summary}", file=out)
    return 0


# ---------------------------------------------------------------------------------------------
# Self-test: the parser against inline samples whose answers are known by hand.

SAMPLE_SIGNATURES = '''\
impl<T> Foo<T> {
    pub(crate) async unsafe fn spread<'a, U: Into<u8>>(
        &'a self,
        x: [u8; 4],
        f: impl Fn(u8) -> u8,
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        U: Clone,
    {
        let _ = x;
    }
    const fn k() -> usize { 3 }
    pub(in crate::a) fn vis() {}
}
fn const_arg() -> Arr<{ 2 + 1 }>
{
    Arr
}
'''

SAMPLE_LITERALS = r'''fn strings() {
    let a = "}{ \" }";
    let b = r"}}}";
    let c = r#"a "}" b { "#;
    let d = r##"x"#}"##;
    let e = '{';
    let f = '}';
    let g = '\'';
    let h = b'{';
    let i = b"}}";
    let j = br#"{"#;
    let k = '\u{7d}';
    // a comment with }
    /* block } /* nested } */ still comment { */
    let l = "multi
line }";
    let m = r"\";
}
fn after() {
    x();
}
'''

SAMPLE_LIFETIMES = '''\
fn longest<'a, 'b: 'a>(x: &'a str, y: &'b str) -> &'a str {
    'outer: loop {
        break 'outer;
    }
    let c = 'a';
    x
}
struct S<'a>(&'a u8);
fn tail() {}
'''

SAMPLE_NESTED = '''\
fn outer() {
    fn inner() {
        let _ = |x: u8| { x };
    }
    inner();
}
type P = fn(u8) -> u8;
macro_rules! m {
    ($n:ident) => { fn $n() {} };
}
'''

SAMPLE_TRAIT = '''\
trait T {
    fn decl(&self);
    fn decl_multi(
        &self,
    ) -> u8;
    fn with_default(&self) -> u8 {
        0
    }
}
extern "C" {
    fn getpid() -> i32;
}
'''

SAMPLE_CFG_TEST = '''\
//! top
#![forbid(unsafe_code)]
pub fn real() {
    let s = "unsafe { }"; // unsafe here is a comment
}
/* unsafe */
#[cfg(test)]
fn helper_only_in_tests() {
}
#[cfg(not(test))]
fn not_test() {
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn t() {
        fn nested_in_test() {}
        unsafe { real() }
    }
}
'''

SAMPLE_UNSAFE = '''\
unsafe fn a() {}
pub unsafe extern "C" fn b() {}
unsafe impl Send for X {}
fn c() { unsafe { a() } }
unsafe extern "C" {}
fn r#unsafe_not() { let r#unsafe = 1; }
#[deny(unsafe_op_in_unsafe_fn)]
fn d() {}
'''

SAMPLE_TEST_FN = '''\
#[test]
fn top_level_test() {
    fn helper_in_test() {}
}
#[tokio::test]
async fn async_test() {}
mod outer {
    #[cfg(all(test, unix))]
    mod inner_tests {
        fn x() {}
    }
    #[cfg(any(test, feature = "f"))]
    pub(crate) fn maybe() {}
}
'''

SAMPLE_OUT_OF_LINE = '''\
fn a() {}
#[cfg(test)]
#[path = "x_tests.rs"]
mod tests;
'''


SAMPLE_IMPLS = '''\
impl Core {
    fn a(&self) {}
}
impl<'a> crate::core::Core {
    fn b(&self) {}
}
impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { Ok(()) }
}
impl<T: Into<u8>> Wrap<T> where T: Clone {
    fn c(&self) {}
}
fn free() {}
'''


def self_test() -> int:
    failures: list[str] = []

    def eq(what: str, got, want) -> None:
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    def parse_or_fail(what: str, src: str) -> Parsed:
        try:
            return parse(src)
        except LexError as e:
            failures.append(f"{what}: cannot parse: {e}")
            return Parsed(0, 0, [], [])

    def fns(what: str, src: str) -> list[tuple[str, int, int, bool]]:
        return [(f.name, f.line, f.lines, f.test) for f in parse_or_fail(what, src).fns]

    eq("multi-line signatures and qualifiers", fns("multi-line signatures and qualifiers", SAMPLE_SIGNATURES),
       [("spread", 2, 10, False), ("k", 12, 1, False), ("vis", 13, 1, False), ("const_arg", 15, 4, False)])
    eq("braces in strings, raw strings, chars, comments", fns("braces in strings, raw strings, chars, comments", SAMPLE_LITERALS),
       [("strings", 1, 18, False), ("after", 19, 3, False)])
    eq("lifetimes and labels vs char literals", fns("lifetimes and labels vs char literals", SAMPLE_LIFETIMES),
       [("longest", 1, 7, False), ("tail", 9, 1, False)])
    eq("nested fns, closures, fn pointer types, macro_rules", fns("nested fns, closures, fn pointer types, macro_rules", SAMPLE_NESTED),
       [("outer", 1, 6, False), ("inner", 2, 3, False)])
    eq("trait and extern declarations have no body", fns("trait and extern declarations have no body", SAMPLE_TRAIT), [("with_default", 6, 3, False)])
    p = parse_or_fail("cfg(test)", SAMPLE_CFG_TEST)
    eq("cfg(test) exemptions", [(f.name, f.line, f.test) for f in p.fns],
       [("real", 3, False), ("helper_only_in_tests", 8, True), ("not_test", 11, False), ("t", 18, True),
        ("nested_in_test", 19, True)])
    eq("cfg(test) module lines", (p.total_lines, p.test_module_lines, p.non_test_lines), (22, 9, 13))
    eq("unsafe in strings/comments/attributes ignored, in tests found", p.unsafe_lines, [20])
    eq("unsafe keyword forms", parse_or_fail("unsafe", SAMPLE_UNSAFE).unsafe_lines, [1, 2, 3, 4, 5])
    p = parse_or_fail("test fns", SAMPLE_TEST_FN)
    eq("#[test] fns, fns nested in them, nested cfg(all(test)) modules; cfg(any(test)) is not test",
       [(f.name, f.test) for f in p.fns],
       [("top_level_test", True), ("helper_in_test", True), ("async_test", True), ("x", True), ("maybe", False)])
    eq("nested cfg(test) module lines", p.non_test_lines, 14 - 4)
    p = parse_or_fail("out-of-line", SAMPLE_OUT_OF_LINE)
    eq("out-of-line cfg(test) mod", (p.total_lines, p.non_test_lines), (4, 1))
    eq("the inherent impl each fn is in (trait impls and free fns: none)",
       [(f.name, f.owner) for f in parse_or_fail("impl owners", SAMPLE_IMPLS).fns],
       [("a", "Core"), ("b", "Core"), ("fmt", None), ("c", "Wrap"), ("free", None)])

    # Lexer failures must be loud, not silently mismatched.
    for bad in ('fn a() { let s = "open; }', "fn a() { /* open }", "fn a() {"):
        try:
            parse(bad)
            failures.append(f"malformed sample parsed without error: {bad!r}")
        except LexError:
            pass

    # End to end over a temp tree: exit codes, budgets per directory, messages.
    with tempfile.TemporaryDirectory() as root:
        def write(rel: str, text: str) -> None:
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)

        def long_fn(name: str, lines: int) -> str:
            return f"fn {name}() {{\n" + "    x();\n" * (lines - 2) + "}\n"

        write("gateway/src/ok.rs", long_fn("at_budget", 70) + "#[cfg(test)]\nmod tests {\n"
              + long_fn("long_test_fn", 300) + "}\n")
        write("gateway/src/uring/mod.rs", long_fn("new_ok", 70) + "unsafe fn u() {}\n")
        write("gateway/src/sys.rs", "unsafe impl Send for X {}\n")
        write("log-store/src/mmap.rs", "unsafe fn map() {}\n")
        write("bench/src/big.rs", "fn a() {}\n" * 651)  # rule (a) does not cover bench yet
        write("fuzz/src/lib.rs", long_fn("not_a_member", 200) + "unsafe fn f() {}\n")
        write("gateway/src/big_tests.rs", long_fn("in_test_file", 900) + "unsafe fn t() {}\n")
        write("gateway/src/tests_only.rs", "fn a() {}\n#[cfg(test)]\nmod tests {\n" + "\n" * 900 + "}\n")
        buf = _Capture()
        eq("test files are checked for unsafe: exit 1", check(root, report=False, out=buf), 1)
        eq("clean tree: only the test file's unsafe", buf.lines[:-1],
           [f"gateway/src/big_tests.rs:901: `unsafe` outside {UNSAFE_WHERE} (budget: 0 here)"])
        os.remove(os.path.join(root, "gateway/src/big_tests.rs"))
        buf = _Capture()
        eq("clean tree after removal: exit 0", check(root, report=False, out=buf), 0)
        eq("clean tree summary", buf.lines[-1].startswith("budgets: ok:"), True)

        write("gateway/src/proto/p.rs", long_fn("new_too_long", 71))
        write("gateway/src/old_long.rs", long_fn("old_too_long", 71))
        write("gateway/src/huge.rs", "fn a() {}\n" * 651)
        write("gateway/src/bad_unsafe.rs", "fn a() { unsafe { b() } }\n")
        write("mcp-front/src/lib.rs", long_fn("front_too_long", 71))
        write("bench/src/load.rs", long_fn("bench_too_long", 71))
        write("log-store/src/log.rs", long_fn("log_too_long", 71) + "fn b() { unsafe { c() } }\n")
        write("cluster/src/lib.rs", long_fn("cluster_too_long", 71))
        buf = _Capture()
        eq("violations: exit 1", check(root, report=False, out=buf), 1)
        unsafe_where = f"outside {UNSAFE_WHERE} (budget: 0 here)"
        eq("violation lines", sorted(buf.lines[:-1]), sorted([
            f"gateway/src/bad_unsafe.rs:1: `unsafe` {unsafe_where}",
            "gateway/src/huge.rs:1: file has 651 non-test lines, budget 650",
            "gateway/src/old_long.rs:1: fn old_too_long is 71 lines, budget 70",
            "gateway/src/proto/p.rs:1: fn new_too_long is 71 lines, budget 70",
            "mcp-front/src/lib.rs:1: fn front_too_long is 71 lines, budget 70",
            "bench/src/load.rs:1: fn bench_too_long is 71 lines, budget 70",
            "log-store/src/log.rs:1: fn log_too_long is 71 lines, budget 70",
            f"log-store/src/log.rs:72: `unsafe` {unsafe_where}",
            "cluster/src/lib.rs:1: fn cluster_too_long is 71 lines, budget 70",
        ]))
        eq("violations summary", buf.lines[-1].startswith("budgets: FAILED, 9 violations"), True)
        buf = _Capture()
        eq("--report never fails", check(root, report=True, out=buf), 0)
        files_at = next(i for i, line in enumerate(buf.lines) if "largest non-test files" in line)
        eq("--report lists the largest files first; over rule (a) only where it applies",
           [line.split()[:3] for line in buf.lines[files_at + 1:files_at + 3]],
           [["651", "bench/src/big.rs", "(over;"], ["651", "gateway/src/huge.rs", "OVER"]])

    for f in failures:
        print(f"self-test FAILED: {f}")
    print(f"budgets self-test: {'FAILED' if failures else 'ok'} ({len(failures)} failures)")
    return 1 if failures else 0


class _Capture:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, s: str) -> None:
        self.lines.extend(x for x in s.split("\n") if x)

    def flush(self) -> None:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="workspace root (default: the parent of scripts/)")
    ap.add_argument("--report", action="store_true", help="print the largest files and longest functions; never fail")
    ap.add_argument("--self-test", action="store_true", help="check the parser on inline samples and exit")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    return check(os.path.abspath(args.root), report=args.report)


if __name__ == "__main__":
    sys.exit(main())
