//! Carbon's pickle protocol (`carbon_pickle`): a message is a 4-byte big-endian length, then a
//! pickle of a list of `(path, (timestamp, value))`, as carbon-relay (protocol 2) and
//! Dropwizard's `PickledGraphite` (protocol 0, the value as a string) send it.
//!
//! Decoded as data only, by a machine of its own: the opcodes of protocols 0 to 4 that make
//! lists, tuples, strings, bytes, numbers, `None` and booleans, and the memo; every other
//! opcode (a global, a call, a dict, a set, an object) refuses the message. Why not a crate:
//! the pickle crates on the registry copy a memoized value at every reference to it
//! (serde-pickle's `resolve_recursive`), so a message of a few hundred bytes that references
//! one list many times takes gigabytes. Here every value is a handle: a string shares its
//! bytes, a list or tuple is an index into the message's arena, so a reference costs the
//! same few bytes whatever it refers to, and a message never takes more than
//! [`MEMORY_PER_BYTE`] times its length; cycles (a list appended to itself) are harmless, and
//! nothing is recursive.

use std::collections::HashMap;
use std::rc::Rc;

/// The most memory a message's decoding takes, per byte of the message: each opcode byte makes
/// at most one value (16 bytes) on the stack or in a list, a memo entry, a mark.
pub const MEMORY_PER_BYTE: usize = 64;

/// A decoded value: a handle, cheap to copy.
#[derive(Clone, Debug)]
enum Value {
    None,
    Number(f64),
    /// A string or bytes, shared.
    Text(Rc<[u8]>),
    /// A list or tuple: its index in the arena.
    Sequence(u32),
}

/// Why a message does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickleError {
    /// It ends before its `STOP`, or an argument runs past its end.
    Truncated,
    /// An opcode that is not data (a global, a call, a dict…), or unknown.
    Refused(u8),
    /// An opcode the stack or the memo cannot serve (nothing to pop, an unknown memo key…).
    Malformed,
    /// The value is not a list or a tuple.
    NotAList,
}

/// A message, decoded: its items as carbon's receiver reads them.
pub struct Decoded {
    sequences: Vec<(bool, Vec<Value>)>,
    top: u32,
}

/// One item of a message: `(path, (timestamp, value))`, or why it is not one.
#[derive(Debug, Clone, PartialEq)]
pub enum Item<'a> {
    Point {
        path: &'a [u8],
        at: f64,
        value: f64,
    },
    /// Not a pair of a path and a pair (carbon logs it and goes on).
    Shape,
    /// A timestamp or value `float()` does not take (carbon skips it silently).
    Number,
}

impl Decoded {
    /// Values held in its lists and tuples: each took an opcode byte of the message at least,
    /// the bound [`MEMORY_PER_BYTE`] rests on.
    #[cfg(test)]
    fn slots(&self) -> usize {
        self.sequences.iter().map(|s| 1 + s.1.len()).sum()
    }

    /// The items, in order.
    pub fn items(&self) -> impl Iterator<Item = Item<'_>> {
        self.sequences[self.top as usize]
            .1
            .iter()
            .map(|raw| self.item(raw))
    }

    fn pair(&self, v: &Value) -> Option<(&Value, &Value)> {
        match v {
            Value::Sequence(i) => match self.sequences[*i as usize].1.as_slice() {
                [a, b] => Some((a, b)),
                _ => None,
            },
            _ => None,
        }
    }

    fn item(&self, raw: &Value) -> Item<'_> {
        let Some((Value::Text(path), point)) = self.pair(raw) else {
            return Item::Shape;
        };
        let Some((at, value)) = self.pair(point) else {
            return Item::Shape;
        };
        match (float(at), float(value)) {
            (Some(at), Some(value)) => Item::Point { path, at, value },
            _ => Item::Number,
        }
    }
}

/// Python's `float()` of a value: numbers, and strings or bytes that read as one.
fn float(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => Some(*n),
        Value::Text(t) => super::carbon::python_float(std::str::from_utf8(t).ok()?.trim()),
        _ => None,
    }
}

/// Decodes one message's pickle.
pub fn decode(bytes: &[u8]) -> Result<Decoded, PickleError> {
    let mut m = Machine {
        bytes,
        at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        sequences: Vec::new(),
    };
    let top = m.run()?;
    match top {
        Value::Sequence(top) => Ok(Decoded {
            sequences: m.sequences,
            top,
        }),
        _ => Err(PickleError::NotAList),
    }
}

struct Machine<'a> {
    bytes: &'a [u8],
    at: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u64, Value>,
    /// Lists and tuples (whether a list: it takes appends), by index.
    sequences: Vec<(bool, Vec<Value>)>,
}

impl Machine<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], PickleError> {
        let end = self.at.checked_add(n).ok_or(PickleError::Truncated)?;
        let taken = self.bytes.get(self.at..end).ok_or(PickleError::Truncated)?;
        self.at = end;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let taken = self.take(n)?;
        Ok(taken
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// A protocol 0 argument: up to its newline.
    fn line(&mut self) -> Result<&[u8], PickleError> {
        let rest = &self.bytes[self.at..];
        let end = memchr::memchr(b'\n', rest).ok_or(PickleError::Truncated)?;
        self.at += end + 1;
        Ok(&rest[..end])
    }

    fn length(&mut self, n: usize) -> Result<usize, PickleError> {
        usize::try_from(self.le(n)?).map_err(|_| PickleError::Truncated)
    }

    fn text(&mut self, len: usize) -> Result<Value, PickleError> {
        Ok(Value::Text(self.take(len)?.into()))
    }

    fn pop(&mut self) -> Result<Value, PickleError> {
        self.stack.pop().ok_or(PickleError::Malformed)
    }

    /// The values above the last mark, the mark removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let mark = self.marks.pop().ok_or(PickleError::Malformed)?;
        Ok(self.stack.split_off(mark.min(self.stack.len())))
    }

    fn sequence(&mut self, list: bool, items: Vec<Value>) -> Value {
        self.sequences.push((list, items));
        Value::Sequence((self.sequences.len() - 1) as u32)
    }

    fn append(&mut self, items: Vec<Value>) -> Result<(), PickleError> {
        match self.stack.last() {
            Some(Value::Sequence(i)) if self.sequences[*i as usize].0 => {
                self.sequences[*i as usize].1.extend(items);
                Ok(())
            }
            _ => Err(PickleError::Malformed),
        }
    }

    fn put(&mut self, key: u64) -> Result<(), PickleError> {
        let top = self.stack.last().ok_or(PickleError::Malformed)?.clone();
        self.memo.insert(key, top);
        Ok(())
    }

    fn get(&mut self, key: u64) -> Result<(), PickleError> {
        let v = self.memo.get(&key).ok_or(PickleError::Malformed)?.clone();
        self.stack.push(v);
        Ok(())
    }

    /// The memo key of a put or get opcode: decimal text (`p`, `g`), a byte (`q`, `h`), four
    /// little-endian bytes (`r`, `j`), or the next key (`MEMOIZE`).
    fn memo_key(&mut self, op: u8) -> Result<u64, PickleError> {
        match op {
            b'p' | b'g' => std::str::from_utf8(self.line()?)
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .ok_or(PickleError::Malformed),
            b'q' | b'h' => Ok(u64::from(self.byte()?)),
            b'r' | b'j' => self.le(4),
            _ => Ok(self.memo.len() as u64),
        }
    }

    /// Runs to `STOP`; the value it returns.
    fn run(&mut self) -> Result<Value, PickleError> {
        loop {
            let op = self.byte()?;
            let pushed = match op {
                b'.' => return self.pop(),
                0x80 => {
                    self.byte()?; // PROTO
                    None
                }
                0x95 => {
                    self.take(8)?; // FRAME: its length, which this machine does not need
                    None
                }
                b'(' => {
                    self.marks.push(self.stack.len());
                    None
                }
                b'N' => Some(Value::None),
                0x88 => Some(Value::Number(1.0)),
                0x89 => Some(Value::Number(0.0)),
                b'I' | b'L' => {
                    // INT, LONG: decimal text ("01" and "00" are True and False); LONG's `L`.
                    let line = self.line()?;
                    let text = std::str::from_utf8(line).map_err(|_| PickleError::Malformed)?;
                    let text = text.trim().trim_end_matches('L');
                    let n = text.parse::<f64>().map_err(|_| PickleError::Malformed)?;
                    if !text
                        .bytes()
                        .all(|b| b.is_ascii_digit() || b == b'-' || b == b'+')
                    {
                        return Err(PickleError::Malformed);
                    }
                    Some(Value::Number(n))
                }
                b'J' => Some(Value::Number(f64::from(self.le(4)? as u32 as i32))),
                b'K' => Some(Value::Number(f64::from(self.byte()?))),
                b'M' => Some(Value::Number(self.le(2)? as f64)),
                0x8a | 0x8b => {
                    // LONG1, LONG4: little-endian two's complement.
                    let n = if op == 0x8a {
                        usize::from(self.byte()?)
                    } else {
                        self.length(4)?
                    };
                    let digits = self.take(n)?;
                    let mut value = 0f64;
                    for &b in digits.iter().rev() {
                        value = value * 256.0 + f64::from(b);
                    }
                    if digits.last().is_some_and(|&b| b & 0x80 != 0) {
                        value -= 256f64.powi(n as i32);
                    }
                    Some(Value::Number(value))
                }
                b'F' => {
                    let line = self.line()?;
                    let n = std::str::from_utf8(line)
                        .ok()
                        .and_then(|t| super::carbon::python_float(t.trim()))
                        .ok_or(PickleError::Malformed)?;
                    Some(Value::Number(n))
                }
                b'G' => Some(Value::Number(f64::from_be_bytes(
                    self.take(8)?.try_into().expect("eight bytes"),
                ))),
                b'S' => {
                    // STRING: a Python 2 repr, quoted, with backslash escapes.
                    let line = self.line()?;
                    let quoted = line.len() >= 2
                        && line[0] == line[line.len() - 1]
                        && matches!(line[0], b'\'' | b'"');
                    if !quoted {
                        return Err(PickleError::Malformed);
                    }
                    Some(Value::Text(unescape(&line[1..line.len() - 1]).into()))
                }
                b'V' => {
                    // UNICODE: raw-unicode-escape (only \uXXXX and \UXXXXXXXX escape).
                    let line = self.line()?.to_vec();
                    Some(Value::Text(raw_unicode(&line)?.into()))
                }
                b'T' | b'X' | b'B' => {
                    let n = self.length(4)?;
                    Some(self.text(n)?)
                }
                b'U' | 0x8c | b'C' => {
                    let n = usize::from(self.byte()?);
                    Some(self.text(n)?)
                }
                0x8d | 0x8e => {
                    let n = self.length(8)?;
                    Some(self.text(n)?)
                }
                b']' => Some(self.sequence(true, Vec::new())),
                b')' => Some(self.sequence(false, Vec::new())),
                b'l' | b't' => {
                    let items = self.pop_mark()?;
                    Some(self.sequence(op == b'l', items))
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let at = self
                        .stack
                        .len()
                        .checked_sub(n)
                        .ok_or(PickleError::Malformed)?;
                    let items = self.stack.split_off(at);
                    Some(self.sequence(false, items))
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append(vec![v])?;
                    None
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.append(items)?;
                    None
                }
                b'0' => {
                    self.pop()?;
                    None
                }
                b'1' => {
                    self.pop_mark()?;
                    None
                }
                b'2' => Some(self.stack.last().ok_or(PickleError::Malformed)?.clone()),
                b'p' | b'q' | b'r' | 0x94 => {
                    let key = self.memo_key(op)?;
                    self.put(key)?;
                    None
                }
                b'g' | b'h' | b'j' => {
                    let key = self.memo_key(op)?;
                    self.get(key)?;
                    None
                }
                other => return Err(PickleError::Refused(other)),
            };
            if let Some(v) = pushed {
                self.stack.push(v);
            }
        }
    }
}

/// A Python 2 string literal's body, its escapes decoded (`codecs.escape_decode`).
fn unescape(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        i += 1;
        if b != b'\\' || i == body.len() {
            out.push(b);
            continue;
        }
        let e = body[i];
        i += 1;
        match e {
            b'\n' => {}
            b'\\' | b'\'' | b'"' => out.push(e),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'x' => {
                let hex = body.get(i..i + 2).and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.extend_from_slice(b"\\x"),
                }
            }
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match body.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            other => out.extend_from_slice(&[b'\\', other]),
        }
    }
    out
}

/// Python's `raw-unicode-escape` decoding, as UTF-8: bytes are Latin-1 characters but for
/// `\uXXXX` and `\UXXXXXXXX`.
fn raw_unicode(body: &[u8]) -> Result<Vec<u8>, PickleError> {
    let mut out = String::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        let wide = match (b, body.get(i + 1)) {
            (b'\\', Some(b'u')) => Some(4),
            (b'\\', Some(b'U')) => Some(8),
            _ => None,
        };
        match wide {
            Some(n) => {
                let hex = body
                    .get(i + 2..i + 2 + n)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                    .and_then(char::from_u32)
                    .ok_or(PickleError::Malformed)?;
                out.push(hex);
                i += 2 + n;
            }
            None => {
                out.push(char::from(b));
                i += 1;
            }
        }
    }
    Ok(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The items of a message, owned: (path, timestamp, value), or why an item is not one.
    fn points(bytes: &[u8]) -> Vec<Result<(String, f64, f64), &'static str>> {
        decode(bytes)
            .unwrap()
            .items()
            .map(|i| match i {
                Item::Point { path, at, value } => {
                    Ok((String::from_utf8(path.to_vec()).unwrap(), at, value))
                }
                Item::Shape => Err("shape"),
                Item::Number => Err("number"),
            })
            .collect()
    }

    fn point(path: &str, at: f64, value: f64) -> Result<(String, f64, f64), &'static str> {
        Ok((path.to_string(), at, value))
    }

    #[test]
    fn carbon_relays_protocol_2() {
        // pickle.dumps([('a.b', (1700000000, 1.5)), ('a.b', (1700000010, 2))], protocol=2)
        let p = b"\x80\x02]q\x00(X\x03\x00\x00\x00a.bq\x01J\x00\xf1SeG?\xf8\x00\x00\x00\x00\x00\x00\x86q\x02\x86q\x03h\x01J\n\xf1SeK\x02\x86q\x04\x86q\x05e.";
        assert_eq!(
            points(p),
            [
                point("a.b", 1_700_000_000.0, 1.5),
                point("a.b", 1_700_000_010.0, 2.0)
            ]
        );
    }

    #[test]
    fn dropwizards_protocol_0_with_the_value_as_a_string() {
        // As PickledGraphite writes it: the timestamp a LONG, the value a quoted STRING.
        let p =
            b"(l(S'web.hits'\n(L1700000000L\nS'2.5'\ntta(S'web.hits'\n(L1700000001L\nS'3'\ntta.";
        assert_eq!(
            points(p),
            [
                point("web.hits", 1_700_000_000.0, 2.5),
                point("web.hits", 1_700_000_001.0, 3.0)
            ]
        );
    }

    #[test]
    fn items_of_another_shape_are_named() {
        // [('a', (1, None)), ('b', 1), ('c', (1, 2, 3)), 5, ('d', (-1, 'x'))]
        let p = b"(lp0\n(S'a'\n(I1\nNttp1\na(S'b'\nI1\ntp2\na(S'c'\n(I1\nI2\nI3\nttp3\naI5\na(S'd'\n(I-1\nS'x'\nttp4\na.";
        assert_eq!(
            points(p),
            [
                Err("number"),
                Err("shape"),
                Err("shape"),
                Err("shape"),
                Err("number")
            ]
        );
        // Python 3's protocol 0: text as raw-unicode-escape, a float as its repr.
        assert_eq!(
            points(b"(lp0\n(Vcaf\xe9\np1\n(I1\nF2.0\ntp2\ntp3\na."),
            [point("caf\u{e9}", 1.0, 2.0)]
        );
    }

    #[test]
    fn anything_but_data_is_refused() {
        // os.system('x'), a dict, a set.
        for (p, op) in [
            (&b"cos\nsystem\n(S'x'\ntR."[..], b'c'),
            (b"\x80\x02}q\x00.", b'}'),
            (b"\x80\x04\x8f.", 0x8f),
        ] {
            assert_eq!(decode(p).err(), Some(PickleError::Refused(op)));
        }
        assert_eq!(decode(b"I1\n.").err(), Some(PickleError::NotAList));
        assert_eq!(decode(b"(lp0\n").err(), Some(PickleError::Truncated));
        assert_eq!(decode(b"a.").err(), Some(PickleError::Malformed));
        assert_eq!(decode(b"]g9\n.").err(), Some(PickleError::Malformed));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20000))]
        /// Any bytes: an answer, never a panic, and no more values than bytes.
        #[test]
        fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Ok(d) = decode(&bytes) {
                proptest::prop_assert!(d.slots() <= bytes.len());
                let _ = d.items().count();
            }
        }

        /// Opcodes of data, in any order: the same.
        #[test]
        fn any_data_opcodes_decode_or_are_refused(ops in proptest::collection::vec(proptest::sample::select(b"().NIJKMGSVTUXabeghjlpqrt012]\x85\x86\x87\x88\x89\x8a\x8c\x94\n'1x".to_vec()), 0..300)) {
            if let Ok(d) = decode(&ops) {
                proptest::prop_assert!(d.slots() <= ops.len());
                let _ = d.items().count();
            }
        }
    }

    #[test]
    fn escapes_decode_as_python_decodes_them() {
        assert_eq!(unescape(br"a\x41\101\n\\\'\q"), b"aAA\n\\'\\q");
        assert_eq!(
            raw_unicode(br"caf\u00e9 \U0001F600").unwrap(),
            "café 😀".as_bytes()
        );
    }

    #[test]
    fn references_cost_a_handle_whatever_they_refer_to() {
        // A list of 1 000 strings of a kilobyte, then a list referencing it 100 000 times:
        // the decoded message holds the kilobytes once.
        let mut p = b"\x80\x02](".to_vec();
        for _ in 0..1000 {
            p.extend_from_slice(b"T\x00\x04\x00\x00");
            p.extend(std::iter::repeat_n(b'x', 1024));
        }
        p.extend_from_slice(b"eq\x00](");
        for _ in 0..100_000 {
            p.extend_from_slice(b"h\x00");
        }
        p.extend_from_slice(b"e.");
        let decoded = decode(&p).unwrap();
        assert_eq!(decoded.items().count(), 100_000);
        assert!(decoded.items().all(|i| i == Item::Shape));
        assert!(decoded.slots() <= p.len());
        // A list appended to itself: a cycle, harmless.
        let cycle = decode(b"]q\x00h\x00a.").unwrap();
        assert_eq!(cycle.items().count(), 1);
    }
}
