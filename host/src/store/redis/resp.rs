//! RESP, the protocol Redis and Valkey speak: a command encoded once, in
//! the bytes it is sent as, and a reply read from the bytes it arrived in
//! (a bulk string is a slice of the read buffer, not a copy). RESP2 and the
//! RESP3 types a server may answer with once `HELLO 3` was sent.

use bytes::Bytes;

/// A command as it goes on the wire: `*argc\r\n` then each argument as a
/// bulk string. Arguments are written as they are added, so sending one is
/// a copy of these bytes.
#[derive(Clone, Debug)]
pub(super) struct Command {
    args: Vec<u8>,
    argc: usize,
}

/// What a command's argument can be: bytes, text, a number.
pub(super) trait Arg {
    fn put(&self, out: &mut Vec<u8>);
}

impl Arg for [u8] {
    fn put(&self, out: &mut Vec<u8>) {
        header(out, b'$', self.len());
        out.extend_from_slice(self);
        out.extend_from_slice(b"\r\n");
    }
}

impl Arg for str {
    fn put(&self, out: &mut Vec<u8>) {
        self.as_bytes().put(out);
    }
}

impl<T: Arg + ?Sized> Arg for &T {
    fn put(&self, out: &mut Vec<u8>) {
        (**self).put(out);
    }
}

impl Arg for Vec<u8> {
    fn put(&self, out: &mut Vec<u8>) {
        self.as_slice().put(out);
    }
}

impl Arg for String {
    fn put(&self, out: &mut Vec<u8>) {
        self.as_bytes().put(out);
    }
}

/// A number is sent as its decimal digits.
macro_rules! number_arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn put(&self, out: &mut Vec<u8>) {
                itoa::Buffer::new().format(*self).put(out);
            }
        }
    )*};
}
number_arg!(u64, u32, usize);

/// `{kind}{n}\r\n`: a bulk string's or an array's length line.
fn header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

impl Command {
    /// A command named `name`, room for `capacity` bytes of arguments.
    pub(super) fn with_capacity(name: &str, capacity: usize) -> Self {
        let mut args = Vec::with_capacity(capacity + name.len() + 16);
        name.put(&mut args);
        Command { args, argc: 1 }
    }

    pub(super) fn new(name: &str) -> Self {
        Command::with_capacity(name, 64)
    }

    pub(super) fn arg(&mut self, arg: impl Arg) -> &mut Self {
        arg.put(&mut self.args);
        self.argc += 1;
        self
    }

    /// Appends the command's bytes to `out`.
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        header(out, b'*', self.argc);
        out.extend_from_slice(&self.args);
    }

    /// The arguments, the name first (for a driver that takes them one by one).
    pub(super) fn args(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = self.args.as_slice();
        std::iter::from_fn(move || {
            // Each is `$len\r\n`, the bytes, `\r\n`, as `Arg::put` wrote it.
            let line = rest.iter().position(|&b| b == b'\r')?;
            let len: usize = std::str::from_utf8(&rest[1..line]).ok()?.parse().ok()?;
            let arg = &rest[line + 2..line + 2 + len];
            rest = &rest[line + 4 + len..];
            Some(arg)
        })
    }
}

/// A reply. RESP3's maps and sets read as arrays (a map's keys and values
/// alternating), its booleans as 0 or 1, a double, a big number or a
/// verbatim string as a bulk string of its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Reply {
    Nil,
    /// `+OK` and the like.
    Status(Bytes),
    /// The server refused the command: its message, `ERR …`, `NOSCRIPT …`.
    Error(Bytes),
    Int(i64),
    Bulk(Bytes),
    Array(Vec<Reply>),
}

impl Reply {
    /// The bytes of a bulk string or a status.
    pub(super) fn bytes(&self) -> Option<&Bytes> {
        match self {
            Reply::Bulk(b) | Reply::Status(b) => Some(b),
            _ => None,
        }
    }

    /// An integer, or a string that holds one.
    pub(super) fn number(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            other => std::str::from_utf8(other.bytes()?).ok()?.parse().ok(),
        }
    }

    /// The first word of an error reply (`NOSCRIPT`, `WRONGTYPE`, `ERR`).
    pub(super) fn error_code(&self) -> Option<&[u8]> {
        match self {
            Reply::Error(message) => message.split(|&b| b == b' ').next(),
            _ => None,
        }
    }
}

/// The server sent bytes that are not RESP: the connection cannot be trusted.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ProtocolError(pub(super) String);

/// Nesting deeper than this is refused: no reply idem asks for comes close.
const DEPTH_MAX: usize = 32;

/// The length of the first whole reply in `buf`, `None` when more bytes
/// are needed. A RESP3 attribute is one frame with the reply it annotates.
pub(super) fn frame_len(buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
    skip(buf, 0, 0)
}

/// Whether the whole reply at the start of `frame` is a RESP3 push: an
/// out-of-band message no command waits for.
pub(super) fn is_push(frame: &[u8]) -> bool {
    frame.first() == Some(&b'>')
}

/// The line at `at` (without `\r\n`) and where the next one starts.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let end = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    Some((&buf[at..end], end + 2))
}

fn int(text: &[u8]) -> Result<i64, ProtocolError> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(ProtocolError(format!(
            "not a number: {:?}",
            String::from_utf8_lossy(text)
        )));
    }
    let n = digits.iter().fold(0i64, |n, &d| {
        n.wrapping_mul(10).wrapping_add(i64::from(d - b'0'))
    });
    Ok(if negative { -n } else { n })
}

/// A length: -1 (none) or 0 and up.
fn length(text: &[u8]) -> Result<Option<usize>, ProtocolError> {
    match int(text)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .map(Some)
            .map_err(|_| ProtocolError(format!("a length of {n}"))),
    }
}

/// Where the reply starting at `at` ends, or `None` if `buf` ends first.
fn skip(buf: &[u8], at: usize, depth: usize) -> Result<Option<usize>, ProtocolError> {
    if depth > DEPTH_MAX {
        return Err(ProtocolError("replies nested too deep".into()));
    }
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some((text, mut next)) = line(buf, at + 1) else {
        return Ok(None);
    };
    match kind {
        b':' => int(text).map(|_| Some(next)),
        b'+' | b'-' | b'_' | b',' | b'#' | b'(' => Ok(Some(next)),
        b'$' | b'!' | b'=' => match length(text)? {
            None => Ok(Some(next)),
            Some(n) => {
                let end = next + n + 2;
                if buf.len() < end {
                    return Ok(None);
                }
                if &buf[end - 2..end] != b"\r\n" {
                    return Err(ProtocolError("a bulk string not ended by CRLF".into()));
                }
                Ok(Some(end))
            }
        },
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let Some(n) = length(text)? else {
                return Ok(Some(next));
            };
            let items = if matches!(kind, b'%' | b'|') {
                n * 2
            } else {
                n
            };
            for _ in 0..items {
                match skip(buf, next, depth + 1)? {
                    Some(end) => next = end,
                    None => return Ok(None),
                }
            }
            // An attribute annotates the reply after it: one frame with it.
            if kind == b'|' {
                return skip(buf, next, depth + 1);
            }
            Ok(Some(next))
        }
        other => Err(ProtocolError(format!(
            "a reply of unknown type {:?}",
            char::from(other)
        ))),
    }
}

/// The reply that `frame` holds whole (as [`frame_len`] measured it).
pub(super) fn read(frame: &Bytes) -> Result<Reply, ProtocolError> {
    read_at(frame, 0).map(|(reply, _)| reply)
}

fn read_at(frame: &Bytes, at: usize) -> Result<(Reply, usize), ProtocolError> {
    let short = || ProtocolError("a reply ends early".into());
    let kind = *frame.get(at).ok_or_else(short)?;
    let (text, next) = line(frame, at + 1).ok_or_else(short)?;
    let slice = |text: &[u8]| frame.slice_ref(text);
    Ok(match kind {
        b'+' => (Reply::Status(slice(text)), next),
        b'-' => (Reply::Error(slice(text)), next),
        b':' => (Reply::Int(int(text)?), next),
        b'_' => (Reply::Nil, next),
        b'#' => (Reply::Int(i64::from(text == b"t")), next),
        b',' | b'(' => (Reply::Bulk(slice(text)), next),
        b'$' | b'!' | b'=' => match length(text)? {
            None => (Reply::Nil, next),
            Some(n) => {
                let body = frame.get(next..next + n).ok_or_else(short)?;
                let reply = match kind {
                    b'!' => Reply::Error(slice(body)),
                    // `txt:` or `mkd:`, then the text.
                    b'=' => Reply::Bulk(slice(body.get(4..).unwrap_or_default())),
                    _ => Reply::Bulk(slice(body)),
                };
                (reply, next + n + 2)
            }
        },
        b'*' | b'~' | b'>' | b'%' => match length(text)? {
            None => (Reply::Nil, next),
            Some(n) => {
                let n = if kind == b'%' { n * 2 } else { n };
                let mut items = Vec::with_capacity(n.min(1024));
                let mut at = next;
                for _ in 0..n {
                    let (item, end) = read_at(frame, at)?;
                    items.push(item);
                    at = end;
                }
                (Reply::Array(items), at)
            }
        },
        b'|' => {
            // Attributes are dropped: the reply they annotate is the one.
            let mut at = next;
            for _ in 0..length(text)?.unwrap_or(0) * 2 {
                at = skip(frame, at, 1)?.ok_or_else(short)?;
            }
            return read_at(frame, at);
        }
        other => {
            return Err(ProtocolError(format!(
                "a reply of unknown type {:?}",
                char::from(other)
            )));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut cmd = Command::new("SET");
        cmd.arg("k")
            .arg(&b"a\r\nb"[..])
            .arg(0u64)
            .arg(u64::MAX)
            .arg(42usize);
        let mut out = b"left".to_vec();
        cmd.encode(&mut out);
        assert_eq!(
            out,
            b"left*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n$1\r\n0\r\n$20\r\n18446744073709551615\r\n$2\r\n42\r\n"
        );
        let args: Vec<&[u8]> = cmd.args().collect();
        assert_eq!(
            args,
            [
                &b"SET"[..],
                b"k",
                b"a\r\nb",
                b"0",
                b"18446744073709551615",
                b"42"
            ]
        );
    }

    /// Each reply, whole, then every shorter prefix of it, which must ask
    /// for more bytes rather than read as something.
    #[test]
    fn replies_read_whole_and_wait_for_the_rest() {
        let cases: Vec<(&[u8], Reply)> = vec![
            (b"+OK\r\n", Reply::Status(Bytes::from_static(b"OK"))),
            (
                b"-NOSCRIPT No matching script.\r\n",
                Reply::Error(Bytes::from_static(b"NOSCRIPT No matching script.")),
            ),
            (b":-42\r\n", Reply::Int(-42)),
            (b":9223372036854775807\r\n", Reply::Int(i64::MAX)),
            (b"$-1\r\n", Reply::Nil),
            (b"*-1\r\n", Reply::Nil),
            (b"_\r\n", Reply::Nil),
            (b"$0\r\n\r\n", bulk("")),
            (b"$5\r\n1 2\r\n\r\n", bulk("1 2\r\n")),
            (b"#t\r\n", Reply::Int(1)),
            (b"#f\r\n", Reply::Int(0)),
            (b",1.5\r\n", bulk("1.5")),
            (b"=7\r\ntxt:abc\r\n", bulk("abc")),
            (
                b"!9\r\nERR oops!\r\n",
                Reply::Error(Bytes::from_static(b"ERR oops!")),
            ),
            (
                b"*2\r\n:0\r\n*2\r\n$1\r\nv\r\n$-1\r\n",
                Reply::Array(vec![
                    Reply::Int(0),
                    Reply::Array(vec![bulk("v"), Reply::Nil]),
                ]),
            ),
            (
                b"%1\r\n+k\r\n:1\r\n",
                Reply::Array(vec![Reply::Status(Bytes::from_static(b"k")), Reply::Int(1)]),
            ),
            (b"~1\r\n:5\r\n", Reply::Array(vec![Reply::Int(5)])),
            (b"|1\r\n+a\r\n:1\r\n:7\r\n", Reply::Int(7)),
        ];
        for (wire, reply) in cases {
            let mut buf = wire.to_vec();
            buf.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(frame_len(&buf), Ok(Some(wire.len())), "{wire:?}");
            let frame = Bytes::copy_from_slice(wire);
            assert_eq!(read(&frame), Ok(reply), "{wire:?}");
            for cut in 0..wire.len() {
                assert_eq!(frame_len(&wire[..cut]), Ok(None), "{wire:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn bulk_strings_are_slices_of_the_read_buffer() {
        let frame = Bytes::from_static(b"$3\r\nabc\r\n");
        let Ok(Reply::Bulk(b)) = read(&frame) else {
            panic!()
        };
        assert_eq!(b.as_ptr(), frame[4..].as_ptr());
    }

    #[test]
    fn pushes_are_told_apart() {
        let wire = b">2\r\n+invalidate\r\n*1\r\n$1\r\nk\r\n";
        assert_eq!(frame_len(wire), Ok(Some(wire.len())));
        assert!(is_push(wire));
        assert!(!is_push(b"*1\r\n:1\r\n"));
    }

    #[test]
    fn bytes_that_are_not_resp_are_refused() {
        for wire in [
            &b"?what\r\n"[..],
            b":12a\r\n",
            b"$-2\r\n",
            b"$3\r\nabcde\r\n",
            b":99999999999999999999\r\n",
        ] {
            assert!(frame_len(wire).is_err(), "{wire:?}");
        }
        let mut deep = b"*1\r\n".repeat(DEPTH_MAX + 2);
        deep.extend_from_slice(b":1\r\n");
        assert!(frame_len(&deep).is_err());
    }

    #[test]
    fn numbers_and_error_codes() {
        assert_eq!(bulk("12").number(), Some(12));
        assert_eq!(Reply::Int(-1).number(), Some(-1));
        assert_eq!(Reply::Nil.number(), None);
        let e = Reply::Error(Bytes::from_static(b"WRONGTYPE Operation against a key"));
        assert_eq!(e.error_code(), Some(&b"WRONGTYPE"[..]));
        assert_eq!(bulk("x").error_code(), None);
    }
}
