//! The same snapshots re-encoded (pickle protocols 2, 3, 5, JSON, gzip, zstd) must give the
//! same analysis. python3 writes the re-pickled forms; Rust compresses.

use std::io::Write;

use crate::util::*;

const PY_REENCODE: &str = r#"
import json, os, pickle, sys
out_dir = sys.argv[1]
made = []
for path in sys.argv[2:]:
    s = pickle.load(open(path, 'rb'))
    base = os.path.join(out_dir, os.path.basename(path).split('.')[0])
    for p in (2, 3, 5):
        with open(f'{base}.p{p}.pickle', 'wb') as f:
            pickle.dump(s, f, protocol=p)
        made.append(f'{base}.p{p}.pickle')
    with open(f'{base}.json', 'w') as f:
        json.dump(s, f)
    made.append(f'{base}.json')
print(json.dumps(made))
"#;

fn without_source(mut v: serde_json::Value) -> serde_json::Value {
    v.as_object_mut().unwrap().remove("source");
    v
}

#[test]
fn reencoded_snapshots_give_identical_analyses() {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = fixture_names().into_iter().filter(|n| !n.starts_with("ddp")).collect();
    let originals: Vec<_> = names.iter().map(|n| plain_pickle(n, dir.path())).collect();
    let mut args = vec![dir.path()];
    args.extend(originals.iter().map(|p| p.as_path()));
    let made: Vec<String> = serde_json::from_value(python_json(PY_REENCODE, &args)).unwrap();
    assert_eq!(made.len(), names.len() * 4);
    let mut failures = Vec::new();
    for (name, original) in names.iter().zip(&originals) {
        let want = without_source(analyze_json(original));
        let raw = std::fs::read(original).unwrap();
        let stem = dir.path().join(name);
        let gz = stem.with_extension("pickle.gz");
        let mut enc = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(&raw).unwrap();
        enc.finish().unwrap();
        let zst = stem.with_extension("pickle.zstd");
        std::fs::write(&zst, zstd::encode_all(&raw[..], 3).unwrap()).unwrap();
        let json_gz = stem.with_extension("json.gz");
        let json = std::fs::read(stem.with_extension("json")).unwrap();
        let mut enc =
            flate2::write::GzEncoder::new(std::fs::File::create(&json_gz).unwrap(), flate2::Compression::fast());
        enc.write_all(&json).unwrap();
        enc.finish().unwrap();
        let mut variants: Vec<_> =
            made.iter().filter(|m| m.contains(&format!("/{name}."))).map(std::path::PathBuf::from).collect();
        variants.extend([gz, zst, json_gz]);
        for v in &variants {
            let got = analyze_json(v);
            let expect_encoding = if v.to_str().unwrap().contains(".json") { "json" } else { "pickle" };
            if got["source"]["encoding"] != expect_encoding {
                failures.push(format!("{}: encoding {}", v.display(), got["source"]["encoding"]));
            }
            let mut diff = Vec::new();
            json_diff(&v.display().to_string(), &want, &without_source(got), &mut diff);
            failures.extend(diff);
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}
