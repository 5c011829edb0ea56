//! A big pickle file read in two parts at once (`reader::Split`): the reader opens the file
//! again for each part, and a thread of its own hashes it meanwhile.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use sha2::{Digest, Sha256};

use crate::reader::{self, Split};
use crate::snapshot::{Snapshot, SnapshotSink, Source};

use super::{IngestError, Ingested, Options, TwoParts, model};

/// Bytes hashed at a time.
const CHUNK: usize = 256 << 10;

pub(super) fn ingest<T>(
    path: &Path,
    len: u64,
    parts: TwoParts,
    options: &Options,
    then: impl FnOnce(&Snapshot) -> T,
) -> Result<(Ingested, T), IngestError> {
    // The second part's thread allocates in a malloc arena of its own, and the first part
    // frees what it took in (chunks of a few MB). glibc's mmap threshold rises to the size of
    // each block freed, so those chunks would stay in that arena, resident, for the rest of the
    // process, and peak memory would grow by them.
    crate::machine::pages::return_blocks_from(256 << 10);
    let mut file = std::fs::File::open(path).map_err(IngestError::Io)?;
    let progress = options.progress.clone();
    // Without the hash, no thread: the size is the file's.
    let hashing = options.hash.then(|| {
        std::thread::spawn(move || -> std::io::Result<(Option<String>, u64)> {
            yield_to_the_parts();
            let (mut hasher, mut count, mut buf) = (Sha256::new(), 0u64, vec![0u8; CHUNK]);
            loop {
                let n = super::input::read_full(&mut file, &mut buf)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                count += n as u64;
                if let Some(p) = &progress {
                    p.store(count, Ordering::Relaxed);
                }
            }
            Ok((Some(crate::units::hex(&hasher.finalize())), count))
        })
    });
    let path = path.to_owned();
    let open: reader::Open = Arc::new(move |at| {
        let mut f = std::fs::File::open(&path)?;
        f.seek(SeekFrom::Start(at))?;
        Ok(Box::new(f) as Box<dyn Read + Send>)
    });
    let split = Split {
        len,
        open,
        min_items: parts.min_items,
        min_bytes: 0,
        fork_share: parts.fork_share,
        quiet: parts.quiet,
        later_share: parts.later_share,
        pace: parts.pace,
        overtake: parts.overtake,
    };
    let mut sink = SnapshotSink::new(options.max_events).within(options.memory);
    let limits = options.limits_within();
    let parsed = reader::read_pickle_split(split, &limits, &mut sink);
    if let Ok(reader::Parsed { later_part: Some(l), .. }) = &parsed {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        tracing::debug!(
            from = l.bytes.start,
            to = l.bytes.end,
            forked_at = l.forked_at,
            walked_ms = ms(l.walked),
            read_ms = ms(l.read),
            waited_ms = ms(l.waited),
            took_in_ms = ms(l.took_in),
            stopped = l.stopped,
            peak_mib = crate::machine::pages::peak_resident_mib(),
            "read in two parts"
        );
    }
    // The hash is finished beside the model's build and `then`: the parts leave it little of
    // either core while they read.
    let made = model(parsed, sink, "", options.memory).map(|m| {
        let out = then(&m.snapshot);
        (m, out)
    });
    let hashed = match hashing {
        Some(h) => h.join().map_err(|_| IngestError::Io(std::io::Error::other("hashing thread failed"))),
        None => Ok(Ok((None, len))),
    };
    let (m, out) = made?;
    let (sha256, bytes) = hashed?.map_err(IngestError::Io)?;
    let source = Source {
        bytes,
        sha256,
        encoding: "pickle".to_string(),
        compression: "none".to_string(),
        pickle_protocol: m.protocol,
    };
    Ok((Ingested { snapshot: m.snapshot, source, fast_dicts: m.fast_dicts, later_part: m.later_part }, out))
}

/// The hash is needed only at the end, the parts all along: on a machine of two cores, the
/// hashing thread runs when a part waits (for the other, or to take it in) rather than beside
/// both. Linux applies a nice value to the calling thread.
fn yield_to_the_parts() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority with PRIO_PROCESS and 0 changes only the calling thread's nice value.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 10);
    }
}
