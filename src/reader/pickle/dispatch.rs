//! The opcode dispatch of the pickle machine: one arm per opcode it accepts, by name; anything
//! else is refused by name (code, imports, out-of-band buffers) or as unknown. The arms read
//! their operands and hand the work to the machine's helpers in `mod.rs`.

use std::io::Read;

use super::entry::Entry;
use super::opcodes as op;
use super::{Res, Vm};
use crate::reader::Sink;
use crate::reader::error::ErrorKind;
use crate::reader::value::{Kind, Value};

impl<R: Read, S: Sink> Vm<'_, R, S> {
    pub(super) fn run(&mut self) -> Res<Value, S::Error> {
        loop {
            self.at = self.input.offset();
            if self.part_ends.is_some() && self.marks.is_empty() && !self.part_goes_on()? {
                // The later part of a split read ends with its list (see `split.rs`).
                return Ok(Value::None);
            }
            let Some(op) = self.input.next_byte()? else {
                return self.err(ErrorKind::NoStop);
            };
            match op {
                op::PROTO => {
                    let p = self.input.byte()?;
                    if p > 5 {
                        return self.err(ErrorKind::UnsupportedProtocol(p));
                    }
                    self.protocol = Some(p);
                }
                op::FRAME => {
                    // FRAME: a length hint for buffering; the input is buffered anyway.
                    self.input.array::<8>()?;
                }
                op::STOP => {
                    if !self.marks.is_empty() || self.stack.len() != 1 {
                        return self.err(ErrorKind::StackUnderflow { opcode: "STOP" });
                    }
                    return self.pop("STOP");
                }
                op::MARK => {
                    if self.marks.len() as u64 >= self.limits.max_marks {
                        return self.limit("open MARKs", self.limits.max_marks);
                    }
                    self.marks.push(self.stack.len());
                }
                op::POP => {
                    self.pop("POP")?;
                }
                op::POP_MARK => {
                    let mark = self.pop_mark("POP_MARK")?;
                    self.stack.truncate(mark);
                }
                op::DUP => {
                    let v = self.top("DUP")?;
                    self.push(v)?;
                }
                op::NONE => self.push(Value::None)?,
                op::NEWTRUE => self.push(Value::Bool(true))?,
                op::NEWFALSE => self.push(Value::Bool(false))?,
                op::BININT => {
                    let v = i32::from_le_bytes(self.input.array()?);
                    self.push(Value::Int(v as i64))?;
                }
                op::BININT1 => {
                    let v = self.input.byte()?;
                    self.push(Value::Int(v as i64))?;
                }
                op::BININT2 => {
                    let v = u16::from_le_bytes(self.input.array()?);
                    self.push(Value::Int(v as i64))?;
                }
                op::LONG1 => {
                    let n = self.input.byte()? as u64;
                    self.long(n)?;
                }
                op::LONG4 => {
                    let n = u32::from_le_bytes(self.input.array()?) as u64;
                    self.long(n)?;
                }
                op::BINFLOAT => {
                    let v = f64::from_be_bytes(self.input.array()?);
                    self.push(Value::Float(v))?;
                }
                op::INT | op::LONG | op::FLOAT => {
                    let line = self.text_line()?;
                    let v = match crate::reader::text::number(op, &line) {
                        Some(v) => v,
                        None => return self.err(ErrorKind::BadText("number")),
                    };
                    self.push(v)?;
                }
                op::SHORT_BINUNICODE => {
                    let n = self.input.byte()? as u64;
                    let v = self.string(n, false)?;
                    self.fused_memoize(v)?;
                }
                op::BINUNICODE => {
                    let n = u32::from_le_bytes(self.input.array()?) as u64;
                    self.string(n, false)?;
                }
                op::BINUNICODE8 => {
                    let n = u64::from_le_bytes(self.input.array()?);
                    self.string(n, false)?;
                }
                op::SHORT_BINSTRING => {
                    let n = self.input.byte()? as u64;
                    self.string(n, false)?;
                }
                op::BINSTRING => {
                    let n = u32::from_le_bytes(self.input.array()?) as u64;
                    self.string(n, false)?;
                }
                op::SHORT_BINBYTES => {
                    let n = self.input.byte()? as u64;
                    self.string(n, true)?;
                }
                op::BINBYTES => {
                    let n = u32::from_le_bytes(self.input.array()?) as u64;
                    self.string(n, true)?;
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = u64::from_le_bytes(self.input.array()?);
                    self.string(n, true)?;
                }
                op::STRING | op::UNICODE => {
                    let line = self.text_line()?;
                    let Some(text) = crate::reader::text::plain_string(op, &line) else {
                        return self.err(ErrorKind::BadText("text string"));
                    };
                    let Some(id) = self.heap.strings.intern(&text, self.limits.max_total_string_bytes) else {
                        return self.limit("total string bytes", self.limits.max_total_string_bytes);
                    };
                    self.push(Value::Str(id))?;
                }
                op::EMPTY_LIST => {
                    let id = self.new_node(Kind::List)?;
                    self.push(Value::Node(id))?;
                    self.fused_memoize_mark(Value::Node(id))?;
                }
                op::EMPTY_DICT => {
                    if self.limits.entry_fast_path {
                        match self.entry_fast()? {
                            Entry::Read => {
                                self.fast_streak += 1;
                                continue;
                            }
                            Entry::Fallback => self.fast_streak = 0,
                            Entry::Short => {}
                            // Only a later part's memo has entries it cannot see.
                            Entry::Unseen => return Ok(Value::None),
                        }
                    }
                    let id = self.new_node(Kind::Dict)?;
                    self.push(Value::Node(id))?;
                    self.fused_memoize_mark(Value::Node(id))?;
                }
                op::EMPTY_TUPLE => {
                    let id = self.new_node(Kind::Tuple)?;
                    self.push(Value::Node(id))?;
                }
                op::EMPTY_SET => {
                    let id = self.new_node(Kind::Set)?;
                    self.push(Value::Node(id))?;
                }
                op::TUPLE1..=op::TUPLE3 => {
                    let n = (op - op::TUPLE1 + 1) as usize;
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return self.err(ErrorKind::StackUnderflow { opcode: "TUPLE1/2/3" });
                    }
                    let id = self.new_node(Kind::Tuple)?;
                    self.extend(id, self.stack.len() - n)?;
                    self.push(Value::Node(id))?;
                }
                op::TUPLE => self.collect(Kind::Tuple, "TUPLE")?,
                op::LIST => self.collect(Kind::List, "LIST")?,
                op::DICT => self.collect(Kind::Dict, "DICT")?,
                op::FROZENSET => self.collect(Kind::Set, "FROZENSET")?,
                op::APPEND => {
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + 2 {
                        return self.err(ErrorKind::StackUnderflow { opcode: "APPEND" });
                    }
                    let list = self.stack[self.stack.len() - 2];
                    let id = self.target(list, "APPEND", "a list", &[Kind::List])?;
                    self.extend(id, self.stack.len() - 1)?;
                }
                op::APPENDS => {
                    self.extend_from_mark("APPENDS", "a list", &[Kind::List])?;
                    if self.parts.is_some() {
                        self.after_appends();
                    }
                }
                op::SETITEM => {
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + 3 {
                        return self.err(ErrorKind::StackUnderflow { opcode: "SETITEM" });
                    }
                    let dict = self.stack[self.stack.len() - 3];
                    let id = self.target(dict, "SETITEM", "a dict", &[Kind::Dict])?;
                    self.extend(id, self.stack.len() - 2)?;
                }
                op::SETITEMS => self.extend_from_mark("SETITEMS", "a dict", &[Kind::Dict])?,
                op::ADDITEMS => self.extend_from_mark("ADDITEMS", "a set", &[Kind::Set])?,
                op::MEMOIZE => {
                    let index = self.memo.len() as u64;
                    self.memo_put(index)?;
                }
                op::BINPUT => {
                    let i = self.input.byte()? as u64;
                    self.memo_put(i)?;
                }
                op::LONG_BINPUT => {
                    let i = u32::from_le_bytes(self.input.array()?) as u64;
                    self.memo_put(i)?;
                }
                op::PUT => {
                    let i = self.text_index()?;
                    self.memo_put(i)?;
                }
                op::BINGET | op::LONG_BINGET => self.memo_get_run(op)?,
                op::GET => {
                    let i = self.text_index()?;
                    self.memo_get(i)?;
                }
                _ => {
                    return match op::refused_name(op) {
                        Some(opcode) => self.err(ErrorKind::Refused { opcode }),
                        None => self.err(ErrorKind::UnknownOpcode(op)),
                    };
                }
            }
        }
    }
}
