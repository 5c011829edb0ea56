//! The memo's opcodes and the operands read from the input: memo puts and gets (and runs of
//! them), strings, longs, protocol 0's text lines, and the fused memoize forms.

use std::io::Read;

use super::*;

impl<R: Read, S: Sink> Vm<'_, R, S> {
    pub(super) fn memo_put(&mut self, index: u64) -> Res<(), S::Error> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.err(ErrorKind::StackUnderflow { opcode: "PUT" });
        }
        let v = self.stack[self.stack.len() - 1];
        self.memo_store(index, v)
    }

    /// Puts `v` (the value on top of the stack) in the memo at `index`, within the limits.
    #[inline(always)]
    pub(super) fn memo_store(&mut self, index: u64, v: Value) -> Res<(), S::Error> {
        let len = self.memo.len() as u64;
        if index > len {
            // Python's pickler never skips indexes; allow a few, as a map.
            if self.memo.sparse.len() as u64 >= self.limits.max_marks {
                return self.limit("sparse memo entries", self.limits.max_marks);
            }
            self.memo.sparse.insert(index, v);
            return Ok(());
        }
        if index == len && len >= self.limits.max_memo {
            return self.limit("memo size", self.limits.max_memo);
        }
        // The memo's slots count against the heap's budget, checked every 64Ki entries.
        if index == len && len & 0xFFFF == 0 && self.heap.budget != 0 {
            self.heap.outside = len * 8;
            if self.heap.over_budget(0) {
                return self.err(self.heap.memory_error(0));
            }
        }
        if !self.memo.put(index as usize, v) {
            return self.limit("memoized scalars", MEMO_PAYLOAD as u64);
        }
        Ok(())
    }

    #[inline(always)]
    pub(super) fn memo_get(&mut self, index: u64) -> Res<(), S::Error> {
        if let Some(slot) = self.memo.slot(index as usize) {
            let v = self.memo.decode(slot);
            return self.push(v);
        }
        match self.memo.sparse.get(&index) {
            Some(&v) => self.push(v),
            None => self.err(ErrorKind::MemoMissing(index)),
        }
    }

    /// BINGET and LONG_BINGET, and the gets right after: they come in runs (a dict's keys and
    /// their shared values), and testing for the next one here predicts better than the
    /// dispatch's jump table.
    #[inline(always)]
    pub(super) fn memo_get_run(&mut self, mut op: u8) -> Res<(), S::Error> {
        loop {
            let i = if op == op::BINGET {
                self.input.byte()? as u64
            } else {
                u32::from_le_bytes(self.input.array()?) as u64
            };
            self.memo_get(i)?;
            match self.input.peek() {
                Some(next @ (op::BINGET | op::LONG_BINGET)) => {
                    self.at = self.input.offset();
                    self.input.skip(1);
                    op = next;
                }
                _ => return Ok(()),
            }
        }
    }

    pub(super) fn string(&mut self, len: u64, bytes: bool) -> Res<Value, S::Error> {
        if len > self.limits.max_string_bytes {
            return self.limit("string length in bytes", self.limits.max_string_bytes);
        }
        let raw = self.input.take(len as usize, &mut self.scratch)?;
        let Some(id) = self.heap.strings.intern_bytes(raw, self.limits.max_total_string_bytes) else {
            return self.limit("total string bytes", self.limits.max_total_string_bytes);
        };
        let v = if bytes { Value::Bytes(id) } else { Value::Str(id) };
        self.push(v)?;
        Ok(v)
    }

    pub(super) fn long(&mut self, len: u64) -> Res<(), S::Error> {
        if let Some(high) = self.input.take_le(len as usize) {
            // The bytes sit at the top of `high`: an arithmetic shift down sign-extends them.
            let v = if len == 0 { 0 } else { (high as i64) >> (64 - 8 * len) };
            return self.push(Value::Int(v));
        }
        if len <= 8 {
            // Near the end of the buffer: byte by byte.
            let mut raw = [0u8; 8];
            for b in raw.iter_mut().take(len as usize) {
                *b = self.input.byte()?;
            }
            let negative = len > 0 && raw[len as usize - 1] & 0x80 != 0;
            if negative {
                raw[len as usize..].fill(0xff);
            }
            return self.push(Value::Int(i64::from_le_bytes(raw)));
        }
        if len > 64 {
            return self.err(ErrorKind::IntTooLarge);
        }
        let raw = self.input.take(len as usize, &mut self.scratch)?;
        match super::super::text::le_int(raw) {
            Some(v) => self.push(v),
            None => self.err(ErrorKind::IntTooLarge),
        }
    }

    pub(super) fn text_line(&mut self) -> Res<String, S::Error> {
        let line = self.input.line(256, &mut self.scratch)?;
        Ok(String::from_utf8_lossy(line).into_owned())
    }

    pub(super) fn text_index(&mut self) -> Res<u64, S::Error> {
        let line = self.text_line()?;
        match line.trim().parse::<u64>() {
            Ok(i) => Ok(i),
            Err(_) => self.err(ErrorKind::BadText("memo index")),
        }
    }

    /// MEMOIZE right after the value it names, done without a trip through the dispatch loop:
    /// protocol 4 writes it after every string and container. `v` is the value just pushed,
    /// passed along rather than read back from the stack (a load right after the store of the
    /// same 16 bytes stalls).
    #[inline(always)]
    pub(super) fn fused_memoize(&mut self, v: Value) -> Res<(), S::Error> {
        if self.input.peek() == Some(op::MEMOIZE) {
            self.at = self.input.offset();
            self.input.skip(1);
            self.memo_store(self.memo.len() as u64, v)?;
        }
        Ok(())
    }

    /// MEMOIZE and MARK after a new container (`EMPTY_DICT MEMOIZE MARK` opens every dict).
    #[inline(always)]
    pub(super) fn fused_memoize_mark(&mut self, v: Value) -> Res<(), S::Error> {
        self.fused_memoize(v)?;
        if self.input.peek() == Some(op::MARK) && (self.marks.len() as u64) < self.limits.max_marks {
            self.input.skip(1);
            self.marks.push(self.stack.len());
        }
        Ok(())
    }
}
