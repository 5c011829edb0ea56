//! `fragscope compare A B`: two snapshot files side by side, as the API's compare route
//! gives them (`--json`), or as text.

use std::io::Write;
use std::path::Path;

use crate::analysis::compare::{Comparison, Pair, compare};
use crate::analysis::{self, Analysis};
use crate::ingest::{self, IngestError};
use crate::units::bytes as fmt_bytes;

/// Reads a file and analyses it as the server does; the error names the file.
fn analysed(file: &Path) -> Result<Analysis, (std::path::PathBuf, IngestError)> {
    let ingested = ingest::ingest_path(file, &super::options()).map_err(|e| (file.to_path_buf(), e))?;
    Ok(analysis::analyze(&ingested.snapshot, ingested.source, analysis::Depth::Report).analysis)
}

/// Compares `a` (before) with `b` (after) and prints the comparison.
pub(super) fn run(a: &Path, b: &Path, json: bool) -> Result<(), (std::path::PathBuf, super::Failed)> {
    let read = |f: &Path| analysed(f).map_err(|(p, e)| (p, super::Failed::Read(e)));
    let (x, y) = (read(a)?, read(b)?);
    let c = compare(&x, &y);
    super::to_stdout(|out| {
        if json {
            serde_json::to_writer_pretty(&mut *out, &c).map_err(std::io::Error::from)?;
            writeln!(out)
        } else {
            write_text(out, a, b, &c)
        }
    })
    .map_err(|e| (a.to_path_buf(), super::Failed::Write(e)))
}

fn change(p: &Pair) -> String {
    let sign = if p.delta < 0 { "-" } else { "+" };
    format!("{} -> {} ({sign}{})", fmt_bytes(p.a), fmt_bytes(p.b), fmt_bytes(p.delta.unsigned_abs()))
}

fn write_text(out: &mut impl Write, a: &Path, b: &Path, c: &Comparison) -> std::io::Result<()> {
    writeln!(out, "a: {}\nb: {}", a.display(), b.display())?;
    if !c.settings.changed.is_empty() {
        writeln!(out, "settings changed: {}", c.settings.changed.join(", "))?;
    }
    for d in &c.devices {
        let dev = d.b_device.map(|b| format!("cuda:{} vs cuda:{b}", d.device)).unwrap_or(format!("cuda:{}", d.device));
        writeln!(out, "\n{dev}")?;
        let oom = |o: bool| if o { "OOM" } else { "no OOM" };
        writeln!(out, "  verdict:         {} ({}) -> {} ({})", d.verdict.a, oom(d.oom.a), d.verdict.b, oom(d.oom.b))?;
        if let Some(note) = &d.steps_note {
            writeln!(out, "  {note}")?;
            if let Some(p) = &d.shared_steps_peak_allocated_bytes {
                writeln!(out, "  highest step peak (allocated), steps both reached: {}", change(p))?;
            }
        }
        writeln!(out, "  peak reserved:   {}", change(&d.peak_reserved_bytes))?;
        writeln!(out, "  peak allocated:  {}", change(&d.peak_allocated_bytes))?;
        writeln!(out, "  final reserved:  {}", change(&d.final_reserved_bytes))?;
        writeln!(out, "  pinned free:     {}", change(&d.pinned_free_bytes))?;
        for (name, p) in &d.categories {
            writeln!(out, "  {name:<16} {}", change(p))?;
        }
        let moved: Vec<_> = d.call_sites.iter().filter(|s| s.delta != 0).take(5).collect();
        if !moved.is_empty() {
            writeln!(out, "  call sites that changed most (at each peak):")?;
            for s in moved {
                let p = Pair { a: s.a_bytes, b: s.b_bytes, delta: s.delta };
                writeln!(out, "    {}  {}", change(&p), s.call_site)?;
            }
        }
    }
    Ok(())
}
