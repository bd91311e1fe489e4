//! The write rounds' own connection to Redis: the commands as packed, the answers read by a
//! reader of the few kinds a round gets back.
//!
//! A flat-out round is thousands of `SET … NX` answered `+OK`, and the `redis` crate's reader (a
//! general parser of every RESP2 and RESP3 type) took about 900 instructions for each: a seventh
//! of the store thread's work. Its connection gives no access to its socket, so the rounds have a
//! connection of their own, made as the crate makes one (the endpoint's address, `AUTH`,
//! `SELECT`), beside the crate's, which does everything else. The round's own answers are
//! simple strings, errors, integers, nil, and the apply script's array of integers.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::time::Duration;

use ::redis::{ConnectionAddr, ConnectionInfo};

/// The most bytes one answer may take: a round's answers are a few bytes each, so an answer past
/// this is a Redis (or something posing as one) that is not answering a round.
const MAX_ANSWER: usize = 1 << 20;

/// How deep arrays may nest in one answer (the apply script's is two deep).
const MAX_DEPTH: usize = 4;

/// Bytes asked of the socket at a time.
const READ_AT_ONCE: usize = 64 << 10;

/// One answer, as a round reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer {
    /// `+OK`: a `SET` that wrote (most of a round's answers; read without an allocation).
    Ok,
    /// `+…` but `OK`.
    Simple(String),
    /// `-…`: the error's text, its code first (`NOSCRIPT …`).
    Error(String),
    Integer(i64),
    /// `$-1` or `*-1`: a `SET … NX` whose key was there.
    Nil,
    Bulk(Vec<u8>),
    Array(Vec<Answer>),
}

impl Answer {
    /// The error's code (its first word), if this is an error.
    pub(super) fn error_code(&self) -> Option<&str> {
        match self {
            Answer::Error(e) => Some(e.split(' ').next().unwrap_or_default()),
            _ => None,
        }
    }
}

enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

impl Stream {
    fn set_timeouts(&self, timeout: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))
            }
            #[cfg(unix)]
            Stream::Unix(s) => {
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))
            }
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            #[cfg(unix)]
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// Why the connection could not be used. Its text names no secret (not the password, not the
/// endpoint: the store adds the endpoint as it may be shown).
#[derive(Debug, thiserror::Error)]
pub(super) enum SocketError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Redis answered something a round does not expect.
    #[error("unexpected answer: {0}")]
    Protocol(&'static str),
    /// The handshake (`AUTH`, `SELECT`) was refused.
    #[error("{step} refused: {code}")]
    Refused { step: &'static str, code: String },
    /// `rediss://`: this build's client has no TLS.
    #[error("TLS endpoints are not supported")]
    Tls,
}

/// The connection: a socket and the answers read from it not yet taken.
pub(super) struct RoundSocket {
    stream: Stream,
    /// Bytes read from the socket: `buf[start..end]` not yet taken. Zeroed once as it grows,
    /// not before each read.
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl RoundSocket {
    /// Connect to the endpoint `info` names, as the `redis` crate does: every socket operation
    /// bounded by `timeout`, then `AUTH` with the endpoint's user and password and `SELECT` of
    /// its database when they are given.
    pub(super) fn connect(info: &ConnectionInfo, timeout: Duration) -> Result<RoundSocket, SocketError> {
        let stream = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let mut last = None;
                let mut found = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&addr, timeout) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                match found {
                    Some(s) => Stream::Tcp(s),
                    None => return Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address")).into()),
                }
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
            _ => return Err(SocketError::Tls),
        };
        stream.set_timeouts(timeout)?;
        let mut socket = RoundSocket { stream, buf: Vec::new(), start: 0, end: 0 };
        let settings = info.redis_settings();
        if let Some(password) = settings.password() {
            let mut cmd = Vec::new();
            match settings.username() {
                Some(user) => {
                    super::resp::array(&mut cmd, 3);
                    super::resp::bulk(&mut cmd, &[b"AUTH"]);
                    super::resp::bulk(&mut cmd, &[user.as_bytes()]);
                }
                None => {
                    super::resp::array(&mut cmd, 2);
                    super::resp::bulk(&mut cmd, &[b"AUTH"]);
                }
            }
            super::resp::bulk(&mut cmd, &[password.as_bytes()]);
            socket.handshake("AUTH", &cmd)?;
        }
        if settings.db() != 0 {
            let mut cmd = Vec::new();
            super::resp::array(&mut cmd, 2);
            super::resp::bulk(&mut cmd, &[b"SELECT"]);
            super::resp::bulk(&mut cmd, &[settings.db().to_string().as_bytes()]);
            socket.handshake("SELECT", &cmd)?;
        }
        Ok(socket)
    }

    fn handshake(&mut self, step: &'static str, cmd: &[u8]) -> Result<(), SocketError> {
        self.send(cmd)?;
        match self.answer()? {
            Answer::Ok | Answer::Simple(_) => Ok(()),
            // The code alone: an `AUTH` error's text could echo what was sent.
            a => Err(SocketError::Refused { step, code: a.error_code().unwrap_or("unexpected answer").to_string() }),
        }
    }

    /// Write `bytes` (commands packed in RESP) to Redis.
    pub(super) fn send(&mut self, bytes: &[u8]) -> Result<(), SocketError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// The next answer, read from the socket as far as it takes.
    pub(super) fn answer(&mut self) -> Result<Answer, SocketError> {
        loop {
            let unread = &self.buf[self.start..self.end];
            let quick = if unread.starts_with(b"+OK\r\n") {
                Some(Answer::Ok)
            } else if unread.starts_with(b"$-1\r\n") {
                Some(Answer::Nil)
            } else {
                None
            };
            if let Some(a) = quick {
                self.take(5);
                return Ok(a);
            }
            match parse(unread, 0)? {
                Some((a, used)) => {
                    self.take(used);
                    return Ok(a);
                }
                None => self.fill()?,
            }
        }
    }

    /// `n` bytes of those read are taken.
    fn take(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Read more of the socket's bytes (at least one) behind those not yet taken.
    fn fill(&mut self) -> Result<(), SocketError> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            if self.end >= MAX_ANSWER {
                return Err(SocketError::Protocol("an answer past its bound"));
            }
            self.buf.resize((2 * self.buf.len()).max(READ_AT_ONCE), 0);
        }
        let n = loop {
            match self.stream.read(&mut self.buf[self.end..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection was closed").into());
        }
        self.end += n;
        Ok(())
    }
}

/// The line at the start of `b` (without its `\r\n`) and the bytes it takes, or `None` when
/// `b` holds no whole line yet.
fn line(b: &[u8]) -> Option<(&[u8], usize)> {
    let end = b.windows(2).position(|w| w == b"\r\n")?;
    Some((&b[..end], end + 2))
}

fn number(b: &[u8]) -> Result<i64, SocketError> {
    std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).ok_or(SocketError::Protocol("a number that is not one"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One answer at the start of `b` and the bytes it takes; `None` when `b` does not hold all of
/// it yet. RESP2's five types: what a round's commands are answered with.
fn parse(b: &[u8], depth: usize) -> Result<Option<(Answer, usize)>, SocketError> {
    let Some(&kind) = b.first() else { return Ok(None) };
    // A line without its end waits for more bytes; the socket bounds how many (`fill`).
    let Some((head, mut used)) = line(&b[1..]) else { return Ok(None) };
    used += 1;
    let answer = match kind {
        b'+' if head == b"OK" => Answer::Ok,
        b'+' => Answer::Simple(text(head)),
        b'-' => Answer::Error(text(head)),
        b':' => Answer::Integer(number(head)?),
        b'$' => {
            let n = number(head)?;
            if n < 0 {
                Answer::Nil
            } else {
                let n = usize::try_from(n).map_err(|_| SocketError::Protocol("a length past its bound"))?;
                if n > MAX_ANSWER {
                    return Err(SocketError::Protocol("a bulk string past its bound"));
                }
                let Some(rest) = b.get(used..used + n + 2) else { return Ok(None) };
                if &rest[n..] != b"\r\n" {
                    return Err(SocketError::Protocol("a bulk string without its end"));
                }
                used += n + 2;
                Answer::Bulk(rest[..n].to_vec())
            }
        }
        b'*' => {
            let n = number(head)?;
            if n < 0 {
                Answer::Nil
            } else {
                if depth >= MAX_DEPTH {
                    return Err(SocketError::Protocol("arrays nested past their bound"));
                }
                let n = usize::try_from(n).map_err(|_| SocketError::Protocol("a length past its bound"))?;
                // Each element takes three bytes at least: a count past what can be there is not
                // believed (nothing is reserved for it).
                let mut items = Vec::with_capacity(n.min(b.len() / 3));
                for _ in 0..n {
                    let Some((a, took)) = parse(&b[used..], depth + 1)? else { return Ok(None) };
                    used += took;
                    items.push(a);
                }
                Answer::Array(items)
            }
        }
        _ => return Err(SocketError::Protocol("an answer of an unknown type")),
    };
    Ok(Some((answer, used)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn whole(b: &[u8]) -> Answer {
        let (a, used) = parse(b, 0).expect("valid").expect("whole");
        assert_eq!(used, b.len(), "{:?}", String::from_utf8_lossy(b));
        a
    }

    /// Each kind of answer a round gets, read as that kind.
    #[test]
    fn answers_a_round_gets_are_read_as_their_kind() {
        let table: &[(&[u8], Answer)] = &[
            (b"+OK\r\n", Answer::Ok),
            (b"+QUEUED\r\n", Answer::Simple("QUEUED".into())),
            (b"$-1\r\n", Answer::Nil),
            (b"*-1\r\n", Answer::Nil),
            (b":42\r\n", Answer::Integer(42)),
            (b":-3\r\n", Answer::Integer(-3)),
            (b"$3\r\na\r\n\r\n", Answer::Bulk(b"a\r\n".to_vec())),
            (b"$0\r\n\r\n", Answer::Bulk(Vec::new())),
            (b"-NOSCRIPT No matching script\r\n", Answer::Error("NOSCRIPT No matching script".into())),
            (b"*2\r\n:7\r\n*0\r\n", Answer::Array(vec![Answer::Integer(7), Answer::Array(Vec::new())])),
            (
                b"*2\r\n:7\r\n*2\r\n:1\r\n:3\r\n",
                Answer::Array(vec![Answer::Integer(7), Answer::Array(vec![Answer::Integer(1), Answer::Integer(3)])]),
            ),
        ];
        for (bytes, want) in table {
            assert_eq!(&whole(bytes), want, "{:?}", String::from_utf8_lossy(bytes));
        }
        assert_eq!(whole(b"-NOSCRIPT No matching script\r\n").error_code(), Some("NOSCRIPT"));
    }

    /// What is not an answer is an error, never a panic or a guess.
    #[test]
    fn what_is_not_an_answer_is_refused() {
        for bytes in [&b"!3\r\nabc\r\n"[..], b":x\r\n", b"$3\r\nabcd\r\n", b"$99999999999\r\n", b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"] {
            assert!(parse(bytes, 0).is_err(), "{:?}", String::from_utf8_lossy(bytes));
        }
    }

    /// Answers that arrive a few bytes at a time, and one larger than a read, are read whole
    /// and in order, across as many reads as they take.
    #[cfg(unix)]
    #[test]
    fn answers_arriving_in_pieces_are_read_whole_and_in_order() {
        let (mut far, near) = UnixStream::pair().expect("a socket pair");
        let mut socket = RoundSocket { stream: Stream::Unix(near), buf: Vec::new(), start: 0, end: 0 };
        let large = vec![b'x'; 3 * READ_AT_ONCE + 7];
        let mut bytes = Vec::new();
        for _ in 0..50 {
            bytes.extend_from_slice(b"+OK\r\n$-1\r\n:12\r\n*2\r\n:7\r\n*1\r\n:2\r\n");
        }
        bytes.extend_from_slice(format!("${}\r\n", large.len()).as_bytes());
        bytes.extend_from_slice(&large);
        bytes.extend_from_slice(b"\r\n+OK\r\n");
        let writer = std::thread::spawn(move || {
            for (i, piece) in bytes.chunks(4096).enumerate() {
                // The first pieces a few bytes at a time, the rest as they come.
                if i == 0 {
                    for small in piece.chunks(3) {
                        far.write_all(small).unwrap();
                        far.flush().unwrap();
                        std::thread::yield_now();
                    }
                } else {
                    far.write_all(piece).unwrap();
                }
            }
        });
        for _ in 0..50 {
            assert_eq!(socket.answer().unwrap(), Answer::Ok);
            assert_eq!(socket.answer().unwrap(), Answer::Nil);
            assert_eq!(socket.answer().unwrap(), Answer::Integer(12));
            assert_eq!(socket.answer().unwrap(), Answer::Array(vec![Answer::Integer(7), Answer::Array(vec![Answer::Integer(2)])]));
        }
        assert_eq!(socket.answer().unwrap(), Answer::Bulk(large));
        assert_eq!(socket.answer().unwrap(), Answer::Ok);
        writer.join().unwrap();
        // The writer is gone: the next answer is an error, not a wait.
        assert!(socket.answer().is_err());
    }

    proptest! {
        /// Every answer cut short is "not yet", never an error and never a different answer.
        #[test]
        fn an_answer_cut_anywhere_is_not_yet_whole(which in 0usize..6, cut in 0usize..40) {
            let answers: [&[u8]; 6] = [b"+OK\r\n", b"$-1\r\n", b":123\r\n", b"$5\r\nab\r\nc\r\n", b"*2\r\n:7\r\n*2\r\n:1\r\n:3\r\n", b"-ERR x\r\n"];
            let b = answers[which];
            let cut = cut % b.len();
            prop_assert_eq!(parse(&b[..cut], 0).expect("a prefix is no error"), None);
        }
    }
}

#[cfg(test)]
mod against_redis {
    use super::*;

    use crate::state::redis_tests::redis_server::{available, RedisServer};

    fn connect(url: &str) -> Result<RoundSocket, SocketError> {
        RoundSocket::connect(::redis::Client::open(url).expect("url").get_connection_info(), Duration::from_millis(500))
    }

    /// The connection authenticates with the endpoint's password: with the right one a round's
    /// commands are answered; with a wrong one, or none, the connection is refused, and the error
    /// names the refusal's code, never a password.
    #[test]
    fn redis_the_rounds_connection_authenticates_and_its_refusal_names_no_password() {
        if !available("redis_the_rounds_connection_authenticates_and_its_refusal_names_no_password") {
            return;
        }
        let r = RedisServer::start_with(false, Some("planted-socket-pw-8"));
        let mut w = connect(&r.url()).expect("the right password");
        let mut cmd = Vec::new();
        super::super::resp::array(&mut cmd, 4);
        for part in [&b"SET"[..], b"k", b"v", b"NX"] {
            super::super::resp::bulk(&mut cmd, &[part]);
        }
        w.send(&cmd).unwrap();
        w.send(&cmd).unwrap();
        assert_eq!(w.answer().unwrap(), Answer::Ok);
        assert_eq!(w.answer().unwrap(), Answer::Nil, "the key was there");
        let wrong = format!("redis://:planted-wrong-pw-9@127.0.0.1:{}", r.port);
        let e = connect(&wrong).err().expect("a wrong password is refused").to_string();
        assert!(e.contains("AUTH refused") && !e.contains("planted-wrong-pw-9") && !e.contains("planted-socket-pw-8"), "{e}");
        // No password: the connection is made, and the round's first command is refused.
        let mut none = connect(&format!("redis://127.0.0.1:{}", r.port)).expect("connected");
        none.send(&cmd).unwrap();
        assert_eq!(none.answer().unwrap().error_code(), Some("NOAUTH"));
    }
}
