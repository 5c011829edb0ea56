//! The pipeline's direction, held by a cheap check of the sources: the web layer never reaches
//! into the reader, and the reader depends on nothing else in the crate.

fn sources(dir: &str) -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    assert!(!out.is_empty(), "no sources under {dir}");
    out
}

#[test]
fn the_web_layer_never_reaches_into_the_reader() {
    for (path, text) in sources("src/web") {
        assert!(!text.contains("reader::"), "{path} uses the reader");
    }
}

#[test]
fn the_reader_depends_on_nothing_else_in_the_crate() {
    for (path, text) in sources("src/reader") {
        assert!(!text.contains("crate::"), "{path} reaches outside the reader");
    }
}
