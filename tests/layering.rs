//! The one-way layering of ARCHITECTURE.md, checked from the source text.
//!
//! Every `src/**/*.rs` is read, comments and literals are dropped, and each
//! `crate::a::b` / `$crate::a::b` / `super::a` path (in `use` items, grouped
//! `{..}` imports and inline paths alike) becomes an edge from the file's
//! top-level module to `a`. The graph between top-level modules must have no
//! cycle and must respect the declared layer order: a module may use its own
//! layer and the layers below it, never one above. Within `backend`, the CPU
//! and GPU backends must not use each other: what both need (argument
//! contract, device-value rules, host views) lives beside them.
//!
//! Limitation: `super` inside an inline `mod` block is resolved as if it were
//! at the file's level; the repository's inline modules are test modules that
//! only use `super::*`, which names no other module.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Layers, top to bottom, and the top-level modules of each. A module may use
/// modules of its own layer (without a cycle) and of any layer below.
const LAYERS: &[(&str, &[&str])] = &[
    // The C ABI.
    ("ffi", &["ffi"]),
    // Validation: caller descriptors -> the typed argument contract.
    ("ops", &["ops"]),
    // Objects that hold a backend and the memory or plans it made.
    ("resources", &["context", "pool", "plan"]),
    // The Backend trait, the CPU and GPU backends, device-value rules.
    ("backend", &["backend"]),
    // The contract between validation and the backends.
    ("args", &["args"]),
    // Domain types and math.
    (
        "domain",
        &[
            "cache_layouts",
            "compressor",
            "dtype",
            "error",
            "fp8",
            "geometry",
            "indexer",
            "overlap",
            "rope",
            "routing",
            "slots",
            "tensor",
        ],
    ),
];

/// Submodules of `backend` that must not use each other.
const SEPARATE_BACKENDS: [&str; 2] = ["cpu", "gpu"];

/// One `crate::...` path found in a file.
#[derive(Debug, Clone)]
struct Reference {
    file: PathBuf,
    line: usize,
    /// Absolute path segments, starting below the crate root.
    path: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Other,
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a source file: `src/a/b.rs` and `src/a/b/mod.rs` are
/// `[a, b]`; `src/lib.rs` is `[]`.
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src_dir()).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// Source text with comments, string, byte-string and char literals blanked
/// (newlines kept, so line numbers stay right). Lifetimes stay code.
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if (c[i] == 'r' || (c[i] == 'b' && next == Some('r')))
            && !prev_is_ident(&c, i)
            && raw_string_len(&c, i).is_some()
        {
            let len = raw_string_len(&c, i).unwrap();
            for &ch in &c[i..i + len] {
                out.push(blank(ch));
            }
            i += len;
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' {
            // A char literal is 'x' or '\..'; anything else is a lifetime.
            let len = if next == Some('\\') {
                c[i + 3..].iter().position(|&ch| ch == '\'').map(|p| p + 4)
            } else if c.get(i + 2) == Some(&'\'') {
                Some(3)
            } else {
                None
            };
            match len {
                Some(len) => {
                    out.push_str(&" ".repeat(len));
                    i += len;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn prev_is_ident(c: &[char], i: usize) -> bool {
    i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')
}

/// Length of a raw (byte) string literal starting at `i`, if one does.
fn raw_string_len(c: &[char], i: usize) -> Option<usize> {
    let mut j = i + if c[i] == 'b' { 2 } else { 1 };
    let hashes = c[j..].iter().take_while(|&&ch| ch == '#').count();
    j += hashes;
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < c.len() {
        if c[j] == '"'
            && c[j + 1..]
                .iter()
                .take(hashes)
                .filter(|&&ch| ch == '#')
                .count()
                == hashes
        {
            return Some(j + 1 + hashes - i);
        }
        j += 1;
    }
    None
}

/// Tokens with their line numbers; `$crate` is the identifier `crate`.
fn tokens(code: &str) -> Vec<(Token, usize)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphabetic() || ch == '_' || (ch == '$' && c.get(i + 1) == Some(&'c')) {
            let start = if ch == '$' { i + 1 } else { i };
            i = start;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Token::Ident(c[start..i].iter().collect()), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Token::PathSep, line));
            i += 2;
        } else {
            out.push((
                match ch {
                    '{' => Token::Open,
                    '}' => Token::Close,
                    ',' => Token::Comma,
                    _ => Token::Other,
                },
                line,
            ));
            i += 1;
        }
    }
    out
}

/// Parses a path tree after a `::` at `toks[*i]` (a segment or a `{..}`
/// group), appending every full path below `prefix` to `out`.
fn path_tree(
    toks: &[(Token, usize)],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<Vec<String>>,
) {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(*i).map(|t| &t.0) {
            Some(Token::Ident(name)) => {
                if name != "self" {
                    path.push(name.clone());
                }
                *i += 1;
            }
            Some(Token::Open) => {
                *i += 1;
                loop {
                    match toks.get(*i).map(|t| &t.0) {
                        Some(Token::Close) => {
                            *i += 1;
                            return;
                        }
                        Some(Token::Comma) => *i += 1,
                        None => return,
                        _ => path_tree(toks, i, &path, out),
                    }
                }
            }
            // `*` and other punctuation end the path.
            _ => {
                out.push(path);
                return;
            }
        }
        if toks.get(*i).map(|t| &t.0) == Some(&Token::PathSep) {
            *i += 1;
        } else {
            out.push(path);
            return;
        }
    }
}

/// Every crate-internal path a file names, made absolute.
fn references(file: &Path) -> Vec<Reference> {
    let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    paths_in(&text, &module_of(file))
        .into_iter()
        .map(|(line, path)| Reference {
            file: file.to_path_buf(),
            line,
            path,
        })
        .collect()
}

/// (line, absolute path) of every `crate::`, `$crate::` and `super::` path in
/// the source of `module`.
fn paths_in(text: &str, module: &[String]) -> Vec<(usize, Vec<String>)> {
    let toks = tokens(&strip(text));
    let mut refs = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let (tok, line) = &toks[i];
        let preceded_by_sep = i > 0 && toks[i - 1].0 == Token::PathSep;
        let base: Option<Vec<String>> = match tok {
            Token::Ident(name) if name == "crate" && !preceded_by_sep => Some(Vec::new()),
            Token::Ident(name) if name == "super" && !preceded_by_sep => {
                // `super` in `a/b.rs` and in `a/b/mod.rs` both name `a`.
                let mut base = module.to_vec();
                base.pop();
                let mut j = i;
                // `super::super::..`
                while toks.get(j + 1).map(|t| &t.0) == Some(&Token::PathSep)
                    && toks.get(j + 2).map(|t| &t.0) == Some(&Token::Ident("super".into()))
                {
                    base.pop();
                    j += 2;
                }
                i = j;
                Some(base)
            }
            _ => None,
        };
        match base {
            Some(base) if toks.get(i + 1).map(|t| &t.0) == Some(&Token::PathSep) => {
                let mut j = i + 2;
                let mut paths = Vec::new();
                path_tree(&toks, &mut j, &base, &mut paths);
                refs.extend(paths.into_iter().map(|path| (*line, path)));
                i = j;
            }
            _ => i += 1,
        }
    }
    refs
}

/// Top-level modules declared in lib.rs.
fn top_level_modules() -> BTreeSet<String> {
    let code = strip(&fs::read_to_string(src_dir().join("lib.rs")).unwrap());
    let toks = tokens(&code);
    toks.windows(2)
        .filter_map(|w| match (&w[0].0, &w[1].0) {
            (Token::Ident(m), Token::Ident(name)) if m == "mod" => Some(name.clone()),
            _ => None,
        })
        .collect()
}

fn all_references() -> Vec<Reference> {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    assert!(files.len() > 50, "found only {} source files", files.len());
    files.iter().flat_map(|f| references(f)).collect()
}

fn location(r: &Reference) -> String {
    format!(
        "{}:{} (crate::{})",
        r.file
            .strip_prefix(env!("CARGO_MANIFEST_DIR"))
            .unwrap()
            .display(),
        r.line,
        r.path.join("::")
    )
}

/// Edges between top-level modules, each with one reference that makes it.
fn module_graph(refs: &[Reference]) -> BTreeMap<String, BTreeMap<String, Reference>> {
    let modules = top_level_modules();
    let mut graph: BTreeMap<String, BTreeMap<String, Reference>> = BTreeMap::new();
    for r in refs {
        let Some(from) = module_of(&r.file).first().cloned() else {
            continue;
        };
        let Some(to) = r.path.first().filter(|m| modules.contains(*m)) else {
            continue;
        };
        if *to != from {
            graph
                .entry(from)
                .or_default()
                .entry(to.clone())
                .or_insert_with(|| r.clone());
        }
    }
    graph
}

/// A cycle of the graph as a list of nodes (first = last), if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeMap<String, Reference>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeMap<String, Reference>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|m| m.keys()) {
            match state.get(next).copied().unwrap_or(0) {
                1 => {
                    let start = stack.iter().position(|n| n == next).unwrap();
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if state.get(node).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(node, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, members)| members.contains(&module))
}

#[test]
fn parser_finds_every_form_of_path() {
    let text = r#"
use crate::a::b;
use crate::{c::{self, d}, e};
// crate::commented::out
/* crate::block /* nested */ crate::comment */
let s = "crate::in_string \" crate::still_string";
let r = r"crate::in_raw_string";
let (q, e) = ('"', '\''); fn f<'a>(x: &'a crate::f::G) {}
pub(crate) fn g() {}
$crate::h::i!();
use super::j::K;
"#;
    let module = ["ops".to_string(), "example".to_string()];
    let found: Vec<(usize, String)> = paths_in(text, &module)
        .into_iter()
        .map(|(line, p)| (line, p.join("::")))
        .collect();
    let expected = [
        (2, "a::b"),
        (3, "c"),
        (3, "c::d"),
        (3, "e"),
        (8, "f::G"),
        (10, "h::i"),
        (11, "ops::j::K"),
    ];
    assert_eq!(found, expected.map(|(l, p)| (l, p.to_string())));
    assert_eq!(module_of(&src_dir().join("ops/mod.rs")), ["ops"]);
    assert_eq!(
        module_of(&src_dir().join("backend/cpu/store.rs")),
        ["backend", "cpu", "store"]
    );
    assert!(module_of(&src_dir().join("lib.rs")).is_empty());
}

#[test]
fn every_top_level_module_has_a_layer() {
    let declared: Vec<&str> = LAYERS.iter().flat_map(|(_, m)| m.iter().copied()).collect();
    let modules = top_level_modules();
    for module in &declared {
        assert!(
            modules.contains(*module),
            "tests/layering.rs places `{module}`, which lib.rs does not declare"
        );
    }
    for module in modules {
        let count = declared.iter().filter(|&&m| m == module).count();
        assert_eq!(
            count, 1,
            "module `{module}` is in {count} layers of tests/layering.rs; place it in one"
        );
    }
}

#[test]
fn no_cycle_between_top_level_modules() {
    let graph = module_graph(&all_references());
    if let Some(cycle) = find_cycle(&graph) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|w| format!("  {} -> {}: {}", w[0], w[1], location(&graph[&w[0]][&w[1]])))
            .collect();
        panic!("import cycle {}:\n{}", cycle.join(" -> "), steps.join("\n"));
    }
}

#[test]
fn nothing_uses_a_layer_above_it() {
    let graph = module_graph(&all_references());
    let mut upward = Vec::new();
    for (from, edges) in &graph {
        for (to, r) in edges {
            let (Some(a), Some(b)) = (layer_of(from), layer_of(to)) else {
                continue;
            };
            if b < a {
                upward.push(format!(
                    "  {from} ({}) uses {to} ({}): {}",
                    LAYERS[a].0,
                    LAYERS[b].0,
                    location(r)
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "upward imports (layers, top to bottom: {}):\n{}",
        LAYERS
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(" -> "),
        upward.join("\n")
    );
}

#[test]
fn cpu_and_gpu_backends_do_not_use_each_other() {
    let mut crossings = Vec::new();
    for r in all_references() {
        let module = module_of(&r.file);
        if module.first().map(String::as_str) != Some("backend")
            || r.path.first().map(String::as_str) != Some("backend")
        {
            continue;
        }
        let (Some(from), Some(to)) = (module.get(1), r.path.get(1)) else {
            continue;
        };
        if from != to
            && SEPARATE_BACKENDS.contains(&from.as_str())
            && SEPARATE_BACKENDS.contains(&to.as_str())
        {
            crossings.push(format!(
                "  backend::{from} uses backend::{to}: {}",
                location(&r)
            ));
        }
    }
    assert!(
        crossings.is_empty(),
        "backends depend on each other:\n{}",
        crossings.join("\n")
    );
}
