//! The pickle opcodes, named as `pickletools` names them. The reader dispatches on these and
//! refuses every opcode that imports, calls or reaches outside the data (see [`refused_name`]).

pub const MARK: u8 = b'(';
pub const STOP: u8 = b'.';
pub const POP: u8 = b'0';
pub const POP_MARK: u8 = b'1';
pub const DUP: u8 = b'2';
pub const FLOAT: u8 = b'F';
pub const INT: u8 = b'I';
pub const BININT: u8 = b'J';
pub const BININT1: u8 = b'K';
pub const LONG: u8 = b'L';
pub const BININT2: u8 = b'M';
pub const NONE: u8 = b'N';
pub const STRING: u8 = b'S';
pub const BINSTRING: u8 = b'T';
pub const SHORT_BINSTRING: u8 = b'U';
pub const UNICODE: u8 = b'V';
pub const BINUNICODE: u8 = b'X';
pub const APPEND: u8 = b'a';
pub const DICT: u8 = b'd';
pub const EMPTY_DICT: u8 = b'}';
pub const APPENDS: u8 = b'e';
pub const GET: u8 = b'g';
pub const BINGET: u8 = b'h';
pub const LONG_BINGET: u8 = b'j';
pub const LIST: u8 = b'l';
pub const EMPTY_LIST: u8 = b']';
pub const PUT: u8 = b'p';
pub const BINPUT: u8 = b'q';
pub const LONG_BINPUT: u8 = b'r';
pub const SETITEM: u8 = b's';
pub const TUPLE: u8 = b't';
pub const EMPTY_TUPLE: u8 = b')';
pub const SETITEMS: u8 = b'u';
pub const BINFLOAT: u8 = b'G';
pub const BINBYTES: u8 = b'B';
pub const SHORT_BINBYTES: u8 = b'C';
// Protocol 2 and up.
pub const PROTO: u8 = 0x80;
pub const TUPLE1: u8 = 0x85;
pub const TUPLE3: u8 = 0x87;
pub const NEWTRUE: u8 = 0x88;
pub const NEWFALSE: u8 = 0x89;
pub const LONG1: u8 = 0x8a;
pub const LONG4: u8 = 0x8b;
// Protocol 4 and up.
pub const SHORT_BINUNICODE: u8 = 0x8c;
pub const BINUNICODE8: u8 = 0x8d;
pub const BINBYTES8: u8 = 0x8e;
pub const EMPTY_SET: u8 = 0x8f;
pub const ADDITEMS: u8 = 0x90;
pub const FROZENSET: u8 = 0x91;
pub const MEMOIZE: u8 = 0x94;
pub const FRAME: u8 = 0x95;
// Protocol 5.
pub const BYTEARRAY8: u8 = 0x96;

/// Opcodes that would run code or reach outside the data; named for the error message.
pub fn refused_name(op: u8) -> Option<&'static str> {
    Some(match op {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        b'i' => "INST",
        b'o' => "OBJ",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => return None,
    })
}
