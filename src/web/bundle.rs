//! The snapshot page's scripts in one file: `static/js/snapshot.js` and every module it imports,
//! each wrapped in a function scope, in the order the browser would evaluate them.
//!
//! Why: the page's first load in a browser with an empty cache spent 50-130 ms fetching its 18
//! modules, six at a time (a browser opens at most six HTTP/1.1 connections to a host), before
//! the first script could run. One file is one request. The modules stay as they are written
//! (and are still served one by one, for the other pages and for tests that import them).
//!
//! Not a general bundler, and needs none: it takes the forms our modules use, one per line
//! (`import { a, b as c } from "./x.js";` and `export function|async function|const|class`),
//! and fails on any other (a test builds the bundle, so such a module fails the tests, not a
//! page). Imports become constants taken from the imported module's exports: the modules
//! export functions, classes and constants, which a live binding would not change.

use std::sync::OnceLock;

use super::assets::ASSETS;

/// Where the page asks for it, under `/static/`.
pub(crate) const PATH: &str = "js/snapshot.bundle.js";
const ENTRY: &str = "js/snapshot.js";

/// The bundle, made once from the built-in modules.
pub(crate) fn snapshot_bundle() -> &'static [u8] {
    static BUNDLE: OnceLock<String> = OnceLock::new();
    BUNDLE.get_or_init(|| build(ENTRY, &source).unwrap_or_else(|e| panic!("bundling {ENTRY}: {e}"))).as_bytes()
}

fn source(path: &str) -> Option<&'static str> {
    ASSETS.iter().find(|(p, _, _)| *p == path).and_then(|(_, _, b)| std::str::from_utf8(b).ok())
}

/// One module, read: what it imports (module path, then (exported, local) names), its body
/// without import lines and `export` keywords, and what it exports.
struct Module {
    imports: Vec<(String, Vec<(String, String)>)>,
    body: String,
    exports: Vec<String>,
}

/// `entry` and what it imports, each once, dependencies first.
fn build(entry: &str, source: &dyn Fn(&str) -> Option<&'static str>) -> Result<String, String> {
    let mut order: Vec<(String, Module)> = Vec::new();
    visit(entry, source, &mut order, &mut Vec::new())?;
    let var = |path: &str| format!("__m{}", order.iter().position(|(p, _)| p == path).unwrap_or(usize::MAX));
    let mut out = format!("// static/{entry} and the modules it imports, in one file (src/web/bundle.rs).\n");
    for (i, (path, m)) in order.iter().enumerate() {
        out.push_str(&format!("const __m{i} = (() => {{\n// static/{path}\n"));
        for (from, names) in &m.imports {
            let names: Vec<String> =
                names.iter().map(|(e, l)| if e == l { e.clone() } else { format!("{e}: {l}") }).collect();
            out.push_str(&format!("const {{ {} }} = {};\n", names.join(", "), var(from)));
        }
        out.push_str(&m.body);
        out.push_str(&format!("\nreturn {{ {} }};\n}})();\n", m.exports.join(", ")));
    }
    Ok(out)
}

/// Adds `path` after the modules it imports; `stack` holds the imports being followed.
fn visit(
    path: &str,
    source: &dyn Fn(&str) -> Option<&'static str>,
    order: &mut Vec<(String, Module)>,
    stack: &mut Vec<String>,
) -> Result<(), String> {
    if order.iter().any(|(p, _)| p == path) {
        return Ok(());
    }
    if stack.iter().any(|p| p == path) {
        return Err(format!("{path} imports itself through {}", stack.join(" -> ")));
    }
    let text = source(path).ok_or_else(|| format!("{path} is not a built-in file"))?;
    let module = read(path, text)?;
    stack.push(path.to_string());
    for (from, _) in &module.imports {
        visit(from, source, order, stack)?;
    }
    stack.pop();
    order.push((path.to_string(), module));
    Ok(())
}

fn read(path: &str, text: &str) -> Result<Module, String> {
    let mut m = Module { imports: Vec::new(), body: String::new(), exports: Vec::new() };
    for (n, line) in text.lines().enumerate() {
        let at = || format!("static/{path}:{}", n + 1);
        if line.starts_with("import ") || line.starts_with("import{") {
            m.imports.push(
                import(path, line).ok_or_else(|| format!("{}: an import not of the form this bundler takes", at()))?,
            );
            continue;
        }
        if let Some(rest) = line.strip_prefix("export ") {
            let name = ["async function ", "function ", "const ", "class "]
                .iter()
                .find_map(|k| rest.strip_prefix(k))
                .map(|r| r.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$')).next().unwrap_or(""))
                .filter(|n| !n.is_empty())
                .ok_or_else(|| format!("{}: an export not of the form this bundler takes", at()))?;
            m.exports.push(name.to_string());
            m.body.push_str(rest);
        } else if line.trim_start().starts_with("export ") || line.contains("import(") || line.contains("import.meta") {
            return Err(format!("{}: an import or export this bundler does not take", at()));
        } else {
            m.body.push_str(line);
        }
        m.body.push('\n');
    }
    Ok(m)
}

/// `import { a, b as c } from "./x.js";` in module `path`: the imported module's path and the
/// (exported, local) names.
fn import(path: &str, line: &str) -> Option<(String, Vec<(String, String)>)> {
    let rest = line.strip_prefix("import")?.trim_start().strip_prefix('{')?;
    let (names, rest) = rest.split_once('}')?;
    let from = rest.trim().strip_prefix("from")?.trim().strip_suffix(';')?.trim();
    let from = from.strip_prefix('"').and_then(|f| f.strip_suffix('"'))?;
    let names = names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| match n.split_once(" as ") {
            Some((e, l)) => (e.trim().to_string(), l.trim().to_string()),
            None => (n.to_string(), n.to_string()),
        })
        .collect();
    Some((resolve(path, from)?, names))
}

/// `from` (relative, "./" or "../") against the directory of `path`.
fn resolve(path: &str, from: &str) -> Option<String> {
    let mut parts: Vec<&str> = path.split('/').collect();
    parts.pop();
    for p in from.split('/') {
        match p {
            "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    from.starts_with('.').then(|| parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_bundle_holds_every_module_once_after_what_it_imports() {
        let bundle = std::str::from_utf8(snapshot_bundle()).unwrap();
        let mut order = Vec::new();
        visit(ENTRY, &source, &mut order, &mut Vec::new()).unwrap();
        assert!(order.len() > 10, "{}", order.len());
        let at = |p: &str| bundle.find(&format!("// static/{p}\n")).unwrap_or_else(|| panic!("{p} missing"));
        for (path, m) in &order {
            assert_eq!(bundle.matches(&format!("// static/{path}\n")).count(), 1, "{path}");
            for (from, _) in &m.imports {
                assert!(at(from) < at(path), "{from} after {path}");
            }
        }
        // What the page runs is the entry, last.
        assert_eq!(order.last().map(|(p, _)| p.as_str()), Some(ENTRY));
        assert!(!bundle.lines().any(|l| l.starts_with("import ") || l.starts_with("export ")));
        assert!(bundle.contains("const { fit: fitCanvas } = __m"), "renamed imports kept");
    }

    #[test]
    fn a_module_the_bundler_cannot_take_is_named() {
        let files = |p: &str| -> Option<&'static str> {
            match p {
                "a.js" => Some("import { b } from \"./b.js\";\nexport function a() { return b; }\n"),
                "b.js" => Some("export default 3;\n"),
                "c.js" => Some("import { c } from \"./c.js\";\n"),
                "d.js" => Some("import * as x from \"./b.js\";\n"),
                _ => None,
            }
        };
        assert_eq!(build("a.js", &files).unwrap_err(), "static/b.js:1: an export not of the form this bundler takes");
        assert!(build("c.js", &files).unwrap_err().contains("imports itself"));
        assert!(build("d.js", &files).unwrap_err().contains("static/d.js:1"));
        assert!(build("e.js", &files).unwrap_err().contains("not a built-in file"));
    }

    #[test]
    fn imports_resolve_against_the_importing_module() {
        assert_eq!(resolve("js/draw/segmap.js", "../data/layout.js").as_deref(), Some("js/data/layout.js"));
        assert_eq!(resolve("js/snapshot.js", "./data/columns.js").as_deref(), Some("js/data/columns.js"));
        assert_eq!(resolve("js/snapshot.js", "data/columns.js"), None);
        let (from, names) =
            import("js/draw/active.js", "import { fit as fitCanvas, x } from \"./canvas.js\";").unwrap();
        assert_eq!(from, "js/draw/canvas.js");
        assert_eq!(names, vec![("fit".into(), "fitCanvas".into()), ("x".into(), "x".into())]);
    }
}
