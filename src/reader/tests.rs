//! Unit tests of the reader on hand-made pickles. Real snapshots are tested in `tests/`.

use super::*;

fn read(bytes: &[u8]) -> Result<Parsed, ReadError> {
    read_pickle(bytes, &Limits::default(), &mut KeepAll).map_err(|f| match f {
        Failure::Read(e) => e,
        Failure::Sink { error, .. } => match error {},
    })
}

fn err(bytes: &[u8]) -> ReadError {
    read(bytes).expect_err("should fail")
}

#[test]
fn shared_values_stay_shared() {
    // Python: f={'a':1}; l=[f]; pickle.dumps([l,l], protocol=4)
    // (the shape serde-pickle 1.2 rejects as recursive)
    let bytes = b"\x80\x04\x95\x13\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94}\x94\x8c\x01a\x94K\x01sah\x01e.";
    let parsed = read(bytes).unwrap();
    let Value::Node(outer) = parsed.root else { panic!("root {:?}", parsed.root) };
    let items: Vec<Value> = parsed.heap.items(outer).collect();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0], items[1], "both entries are the same list");
    let Value::Node(inner) = items[0] else { panic!() };
    let Value::Node(dict) = parsed.heap.items(inner).next().unwrap() else { panic!() };
    let a = parsed.heap.strings.find("a").unwrap();
    assert_eq!(parsed.heap.get(dict, a), Some(Value::Int(1)));
    assert_eq!(parsed.protocol, Some(4));
}

#[test]
fn global_and_reduce_are_refused_with_offset() {
    // pickle.dumps(os.system) at protocol 2 style: c os\nsystem\n (S'echo'\n tR.
    let e = err(b"\x80\x02cos\nsystem\nq\x00.");
    assert_eq!(e.kind, ErrorKind::Refused { opcode: "GLOBAL" });
    assert_eq!(e.offset, 2);
    let e = err(b"\x80\x04N)R.");
    assert_eq!(e.kind, ErrorKind::Refused { opcode: "REDUCE" });
    assert_eq!(e.offset, 4);
    assert!(e.to_string().contains("REDUCE") && e.to_string().contains("byte 4"), "{e}");
}

#[test]
fn memo_get_of_missing_index() {
    let e = err(b"\x80\x04h\x07.");
    assert_eq!(e.kind, ErrorKind::MemoMissing(7));
    assert_eq!(e.offset, 2);
}

#[test]
fn huge_length_prefix_is_refused_before_allocating() {
    let mut bytes = b"\x80\x04\x8d".to_vec();
    bytes.extend_from_slice(&(1u64 << 62).to_le_bytes());
    let e = err(&bytes);
    assert!(matches!(e.kind, ErrorKind::Limit { what: "string length in bytes", .. }), "{e}");
}

#[test]
fn truncation_anywhere_is_an_error() {
    let bytes = b"\x80\x04\x95\x13\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94}\x94\x8c\x01a\x94K\x01sah\x01e.";
    for cut in 0..bytes.len() {
        let e = err(&bytes[..cut]);
        assert!(e.offset <= cut as u64, "cut {cut}: {e}");
    }
}

#[test]
fn deep_nesting_is_capped() {
    let mut bytes = b"\x80\x04".to_vec();
    bytes.extend(std::iter::repeat_n(b']', 100_000));
    bytes.extend(std::iter::repeat_n(b'a', 99_999));
    bytes.push(b'.');
    let e = err(&bytes);
    assert!(matches!(e.kind, ErrorKind::Limit { what: "nesting depth", .. }), "{e}");
}

#[test]
fn self_containing_list_is_refused() {
    // l = []; l.append(l)
    let e = err(b"\x80\x04]\x94h\x00a.");
    assert_eq!(e.kind, ErrorKind::Recursive);
}

#[test]
fn protocol_above_5_is_refused() {
    assert_eq!(err(b"\x80\x06N.").kind, ErrorKind::UnsupportedProtocol(6));
}

#[test]
fn stop_with_extra_values_is_an_error() {
    assert!(matches!(err(b"NN.").kind, ErrorKind::StackUnderflow { .. }));
    assert_eq!(err(b"").kind, ErrorKind::NoStop);
}

#[test]
fn long1_reads_addresses() {
    // pickle.dumps(140396810207232, protocol=4) -> LONG1 with 6 bytes
    let parsed = read(b"\x80\x04\x8a\x06\x00\x00\x00\xae\xb0\x7f.").unwrap();
    assert_eq!(parsed.root, Value::Int(140396810207232));
}

#[test]
fn long1_signs_and_widths_match_python_near_and_far_from_the_end() {
    // (pickle.dumps(v, protocol=2), v): read once as is (the operand ends the input) and once
    // with padding after STOP (a whole word is buffered, the fast path).
    let cases: [(&[u8], i64); 5] = [
        (b"\x80\x02\x8a\x06\x00\x00\x00\x00\x00\xff.", -1099511627776),
        (b"\x80\x02\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f.", i64::MAX),
        (b"\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80.", i64::MIN),
        (b"\x80\x02\x8a\x02\x80\x00.", 128),
        (b"\x80\x02\x8a\x00.", 0),
    ];
    for (bytes, want) in cases {
        let padded = [bytes, &[0u8; 16][..]].concat();
        assert_eq!(read(bytes).unwrap().root, Value::Int(want), "{bytes:?}");
        assert_eq!(read(&padded).unwrap().root, Value::Int(want), "{bytes:?} padded");
    }
}

#[test]
fn json_reads_into_the_same_heap() {
    let text = br#"{"segments": [{"address": 5, "blocks": []}], "x": [1.5, null, true, "s"]}"#;
    let parsed = read_json(&text[..], &Limits::default(), &mut KeepAll).unwrap();
    let Value::Node(root) = parsed.root else { panic!() };
    let segs = parsed.heap.strings.find("segments").unwrap();
    let Some(Value::Node(list)) = parsed.heap.get(root, segs) else { panic!() };
    assert_eq!(parsed.heap.len(list), 1);
}

#[test]
fn json_errors_name_an_offset() {
    let text = br#"{"segments": [1, 2, }"#;
    let e = match read_json(&text[..], &Limits::default(), &mut KeepAll) {
        Err(Failure::Read(e)) => e,
        other => panic!("{other:?}"),
    };
    assert!(matches!(e.kind, ErrorKind::Json(_)), "{e}");
    assert!(e.offset >= 18 && e.offset <= 21, "{e}");
    let deep = "[".repeat(1_000_000);
    assert!(read_json(deep.as_bytes(), &Limits::default(), &mut KeepAll).is_err());
}

/// Folds every dict that has the key "x" into the number of items it was offered.
struct FoldX {
    calls: Vec<usize>,
}

impl Sink for FoldX {
    type Error = String;
    fn fold_dict(&mut self, heap: &Heap, items: &[Value]) -> Result<Option<u32>, String> {
        let key = |name: &str| {
            let k = heap.strings.find(name);
            items.chunks_exact(2).any(|kv| matches!(kv[0], Value::Str(s) if Some(s) == k))
        };
        if key("bad") {
            return Err("a bad dict".into());
        }
        if !key("x") {
            return Ok(None);
        }
        self.calls.push(items.len());
        Ok(Some(items.len() as u32))
    }
}

fn pickle_dict(pairs: usize, batch: usize) -> Vec<u8> {
    // [{"x": 0, "k1": 1, ...}] written the way Python batches SETITEMS.
    let mut out = b"\x80\x04]\x94}\x94".to_vec();
    let mut written = 0;
    while written < pairs {
        out.push(b'(');
        for i in written..(written + batch).min(pairs) {
            let key = if i == 0 { "x".to_string() } else { format!("k{i}") };
            out.push(0x8c);
            out.push(key.len() as u8);
            out.extend_from_slice(key.as_bytes());
            out.extend_from_slice(b"K\x01");
        }
        out.push(b'u');
        written = (written + batch).min(pairs);
    }
    out.extend_from_slice(b"a.");
    out
}

fn read_fold(bytes: &[u8]) -> (Result<Parsed, Failure<String>>, Vec<usize>) {
    let mut sink = FoldX { calls: Vec::new() };
    let r = read_pickle(bytes, &Limits::default(), &mut sink);
    (r, sink.calls)
}

#[test]
fn a_short_batch_is_folded_from_the_stack() {
    let (r, calls) = read_fold(&pickle_dict(3, 1000));
    let parsed = r.unwrap();
    assert_eq!(calls, vec![6], "offered once, with all three pairs");
    let Value::Node(list) = parsed.root else { panic!() };
    assert_eq!(parsed.heap.items(list).collect::<Vec<_>>(), vec![Value::Folded(6)]);
}

#[test]
fn a_dict_written_in_several_batches_is_folded_whole() {
    // 1000 pairs in the first batch (not provably the last), one more in a second.
    let (r, calls) = read_fold(&pickle_dict(1001, 1000));
    r.unwrap();
    assert_eq!(calls, vec![2002], "folded once, when complete, with every pair");
}

#[test]
fn changing_a_folded_dict_is_refused() {
    // {"x": 1} folded at SETITEMS, then DUP'd... here: memo get of the dict and another SETITEM.
    let bytes = b"\x80\x04}\x94(\x8c\x01x\x94K\x01uh\x00\x8c\x01y\x94K\x02s0.";
    let (r, _) = read_fold(bytes);
    match r {
        Err(Failure::Read(e)) => assert!(matches!(e.kind, ErrorKind::WrongType { .. } | ErrorKind::Recursive), "{e}"),
        other => panic!("{other:?}"),
    }
}

/// Reads `bytes` with the entry fast path on and off: what each ended with (the error and its
/// offset, or the sink's calls), which must be the same.
fn both_paths(bytes: &[u8]) -> String {
    let mut out = Vec::new();
    for fast in [true, false] {
        let limits = Limits { entry_fast_path: fast, ..Limits::default() };
        let mut sink = FoldX { calls: Vec::new() };
        let r = read_pickle(bytes, &limits, &mut sink);
        out.push(match r {
            Ok(p) => format!("ok {:?} calls {:?} protocol {:?}", p.root.type_name(), sink.calls, p.protocol),
            Err(Failure::Read(e)) => format!("read error {e}"),
            Err(Failure::Sink { error, offset }) => format!("sink error {error} at {offset}"),
        });
    }
    assert_eq!(out[0], out[1], "fast path, then general machine");
    out.swap_remove(0)
}

#[test]
fn a_dict_that_holds_itself_is_refused_by_both_paths() {
    // [{"x": 1, "me": <memo get of the dict itself>}]
    let r = both_paths(b"\x80\x04]\x94(}\x94(\x8c\x01x\x94K\x01\x8c\x02me\x94h\x01ue.");
    assert_eq!(r, "read error a container contains itself at byte 21");
}

#[test]
fn a_sink_error_names_the_same_opcode_on_both_paths() {
    // The SETITEMS of {"bad": 1} is at byte 16.
    let r = both_paths(b"\x80\x04]\x94(}\x94(\x8c\x03bad\x94K\x01ue.");
    assert_eq!(r, "sink error a bad dict at 16");
}

#[test]
fn shapes_the_fast_path_leaves_alone_read_the_same() {
    for bytes in [
        // A FRAME opcode inside the dict.
        &b"\x80\x04]\x94(}\x94(\x8c\x01x\x94\x95\x00\x00\x00\x00\x00\x00\x00\x00K\x01ue."[..],
        // A BINPUT of an index already used, and one past the end.
        b"\x80\x04]\x94(}q\x00(\x8c\x01x\x94K\x01ue.",
        b"\x80\x04]\x94(}q\x07(\x8c\x01x\x94K\x01ue.",
        // An empty dict, a dict of one key, a nested dict, a nine-byte int.
        b"\x80\x04]\x94(}\x94(ue.",
        b"\x80\x04]\x94(}\x94(\x8c\x01x\x94ue.",
        b"\x80\x04]\x94(}\x94(\x8c\x01x\x94}\x94ue.",
        b"\x80\x04]\x94(}\x94(\x8c\x01x\x94\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01ue.",
        // The input ends inside the dict.
        b"\x80\x04]\x94(}\x94(\x8c\x01x\x94K",
    ] {
        both_paths(bytes);
    }
    assert_eq!(both_paths(b"\x80\x04]\x94(}\x94(\x8c\x01x\x94K\x01ue."), "ok \"container\" calls [2] protocol Some(4)");
}

/// Keeps each dict with the key "x", as the values it was offered, and folds it to its number.
struct Record {
    dicts: Vec<String>,
}

impl Sink for Record {
    type Error = String;
    fn fold_dict(&mut self, heap: &Heap, items: &[Value]) -> Result<Option<u32>, String> {
        let x = heap.strings.find("x");
        if !items.chunks_exact(2).any(|kv| matches!(kv[0], Value::Str(s) if Some(s) == x)) {
            return Ok(None);
        }
        self.dicts.push(format!("{items:?}"));
        Ok(Some(self.dicts.len() as u32))
    }
}

/// Hands out at most `n` bytes a read, so that the reader's buffer often ends inside a dict.
struct Trickle<'a> {
    bytes: &'a [u8],
    n: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.n.min(buf.len()).min(self.bytes.len());
        buf[..k].copy_from_slice(&self.bytes[..k]);
        self.bytes = &self.bytes[k..];
        Ok(k)
    }
}

/// A list of `n` trace-like dicts in batches of 1000, its keys memoized once and got after.
fn entries(n: usize) -> Vec<u8> {
    let mut out = b"\x80\x04]\x94".to_vec();
    for batch in 0..n.div_ceil(1000) {
        out.push(b'(');
        for i in batch * 1000..((batch + 1) * 1000).min(n) {
            out.extend_from_slice(b"}\x94(");
            if i == 0 {
                // The list is memo 0, this dict 1, "x" 2 and "y" 3.
                out.extend_from_slice(b"\x8c\x01x\x94K\x07\x8c\x01y\x94");
            } else {
                out.extend_from_slice(b"h\x02K\x07h\x03");
            }
            // A value whose opcode and length vary: BININT1, BININT2, BININT, LONG1.
            match i % 4 {
                0 => out.extend_from_slice(&[b'K', i as u8]),
                1 => out.extend_from_slice(&[b'M', i as u8, 1]),
                2 => out.extend_from_slice(&[b'J', i as u8, 0, 1, 0]),
                _ => out.extend_from_slice(&[0x8a, 6, i as u8, 0, 0, 0, 0x80, 0x7f]),
            }
            out.push(b'u');
        }
        out.push(b'e');
    }
    out.push(b'.');
    out
}

/// The fast path reads a run of dicts in one call, and leaves the first it cannot finish
/// within the bytes buffered to the dispatch: read a few bytes at a time, the dicts are those
/// the general machine reads from the whole, and the fast path still reads most of them.
#[test]
fn runs_of_dicts_cut_by_the_buffers_end_read_as_the_general_machine_reads_them() {
    let bytes = entries(2500);
    let mut general = Record { dicts: Vec::new() };
    let whole = read_pickle(&bytes[..], &Limits { entry_fast_path: false, ..Limits::default() }, &mut general);
    let whole = whole.map_err(|_| "the general machine failed").unwrap();
    assert_eq!((general.dicts.len(), whole.fast_dicts), (2500, 0));
    for n in [1, 7, 61, 397, 4093, usize::MAX] {
        let mut fast = Record { dicts: Vec::new() };
        let r = read_pickle(Trickle { bytes: &bytes, n }, &Limits::default(), &mut fast);
        let r = r.map_err(|_| format!("{n} bytes a read failed")).unwrap();
        assert!(fast.dicts == general.dicts, "{n} bytes a read: the dicts differ");
        assert_eq!((r.bytes_read, r.root.type_name()), (whole.bytes_read, whole.root.type_name()));
        if n >= 397 {
            assert!(r.fast_dicts >= 2000, "{n} bytes a read: {} fast", r.fast_dicts);
        }
    }
}

/// Records each entry (a dict with the key "x") as [`Record`] does, and folds each frames
/// list to the number of the first list of the same items, counting the folds it is asked for.
struct Stacks {
    entries: Record,
    lists: Vec<Vec<Value>>,
    list_folds: usize,
}

impl Default for Stacks {
    fn default() -> Self {
        Stacks { entries: Record { dicts: Vec::new() }, lists: Vec::new(), list_folds: 0 }
    }
}

impl Sink for Stacks {
    type Error = String;
    fn fold_dict(&mut self, heap: &Heap, items: &[Value]) -> Result<Option<u32>, String> {
        self.entries.fold_dict(heap, items)
    }
    fn fold_list(&mut self, _heap: &Heap, items: &[Value]) -> Result<Option<u32>, String> {
        self.list_folds += 1;
        let n = match self.lists.iter().position(|l| l == items) {
            Some(n) => n,
            None => {
                self.lists.push(items.to_vec());
                self.lists.len() - 1
            }
        };
        Ok(Some(1_000_000 + n as u32))
    }
}

/// `n` entries `{"x": i, "frames": [...]}` whose frames lists (of 20 to 44 memoized frame
/// dicts, got by LONG_BINGET: 100 to 220 bytes) are `stacks` lists taken in turn out of order,
/// in batches of 1000. The first entry defines the 64 frame dicts in a list of its own.
fn long_stacks(n: usize, stacks: usize) -> Vec<u8> {
    // Memo: the list 0, the first entry 1, "x" 2, "defs" 3, its list 4, "n" 6, the frame
    // dicts 5 and 7 on (one a slot after the first), "frames" after them.
    let mut out = b"\x80\x04]\x94(}\x94(\x8c\x01x\x94K\x00\x8c\x04defs\x94]\x94(".to_vec();
    let mut frame_slots = Vec::new();
    for f in 0..64u32 {
        frame_slots.push(if f == 0 { 5 } else { 6 + f });
        out.extend_from_slice(b"}\x94(");
        out.extend_from_slice(if f == 0 { b"\x8c\x01n\x94" } else { b"h\x06" });
        out.push(b'J');
        out.extend_from_slice(&f.to_le_bytes());
        out.push(b'u');
    }
    out.extend_from_slice(b"e\x8c\x06frames\x94]\x94(j");
    out.extend_from_slice(&frame_slots[0].to_le_bytes());
    out.extend_from_slice(b"eu");
    let frames_key = 6 + 64;
    let stack = |s: usize| -> Vec<u32> { (0..20 + s % 25).map(|k| frame_slots[(s * 13 + k * 7) % 64]).collect() };
    for i in 1..n {
        if i % 1000 == 0 {
            out.extend_from_slice(b"e(");
        }
        out.extend_from_slice(b"}\x94(h\x02K");
        out.push(i as u8);
        out.push(b'h');
        out.push(frames_key as u8);
        out.extend_from_slice(b"]\x94(");
        for slot in stack((i * 7919) % stacks) {
            out.push(b'j');
            out.extend_from_slice(&slot.to_le_bytes());
        }
        out.extend_from_slice(b"eu");
    }
    out.extend_from_slice(b"e.");
    out
}

/// A trace's python stacks run to dozens of frames and interleave: the fast path finds each
/// list it folded before again by its bytes, however long (up to 256 bytes) and however far
/// back, and folds it without asking the sink; what it makes is what the general machine
/// makes, asking the sink for every list.
#[test]
fn long_interleaved_frames_lists_are_folded_once_and_read_as_the_general_machine_reads_them() {
    let bytes = long_stacks(3000, 48);
    let mut general = Stacks::default();
    let whole = read_pickle(&bytes[..], &Limits { entry_fast_path: false, ..Limits::default() }, &mut general);
    let whole = whole.map_err(|e| format!("the general machine failed: {e:?}")).unwrap();
    assert_eq!((general.entries.dicts.len(), general.lists.len(), general.list_folds), (3000, 50, 3001));
    for n in [397, 4093, usize::MAX] {
        let mut fast = Stacks::default();
        let r = read_pickle(Trickle { bytes: &bytes, n }, &Limits::default(), &mut fast);
        let r = r.map_err(|_| format!("{n} bytes a read failed")).unwrap();
        assert!(fast.entries.dicts == general.entries.dicts, "{n} bytes a read: the entries differ");
        assert_eq!((r.bytes_read, fast.lists.len()), (whole.bytes_read, 50));
        let fewest = match n {
            usize::MAX => 2990,
            4093 => 2700,
            _ => 1000,
        };
        assert!(r.fast_dicts >= fewest, "{n} bytes a read: {} fast", r.fast_dicts);
        // Each list once where the fast path read its entry (the first time, or again after
        // a few were forgotten), and every time the general machine read its entry.
        let most = 60 + (3000 - r.fast_dicts as usize);
        assert!(fast.list_folds <= most, "{n} bytes a read: the sink folded {} lists", fast.list_folds);
    }
}
