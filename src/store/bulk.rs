//! Bulk reads for the Graphite API: many `HMGET`s pipelined on a connection of their own, each
//! reply parsed straight into numbers as it arrives. A render of 100 series over a day is
//! 144 000 values; through the redis crate each is a `redis::Value` (a parser's state machine
//! and an allocation each), which cost the agent close to half its CPU for such a render
//! (docs/benchmarks.md, "Graphite API"). Here a value is read from the socket's buffer in
//! place. A long archive's blocks (`GETRANGE`s, [`BulkPool::pipeline`]) are read on the same
//! connections, each reply's bytes copied once. Only one server without TLS is read so
//! ([`Store::bulk_target`]); Sentinel, Cluster and TLS take the redis crate's way.
//!
//! [`Store::bulk_target`]: super::Store::bulk_target

use std::path::PathBuf;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::StoreError;

/// A value as the Graphite API holds it: `None` where the hash has no field.
pub type Point = Option<f64>;

/// Where a bulk reader connects, and how it logs in.
#[derive(Debug, Clone)]
pub struct BulkTarget {
    pub addr: BulkAddr,
    pub username: Option<String>,
    pub password: Option<String>,
    pub db: i64,
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
pub enum BulkAddr {
    Tcp(String, u16),
    Unix(PathBuf),
}

/// Fewer fields than this are read with `HMGET` from a listpack hash too: a scan each, cheaper
/// than the whole hash's reply (`HGETALL` costs about as much a field as a dozen fields scanned).
/// More are read whole ([`Hmget::whole`]) from a hash known to be short: a long archive's keeps
/// its newest slices only, the rest in blocks.
pub const FEW_FIELDS: usize = 8;

/// One `HMGET`: a key and its fields (slice times, ascending).
pub struct Hmget<'a> {
    pub key: &'a [u8],
    pub fields: &'a [i64],
    /// Read with `HGETALL` and the fields picked here instead: a listpack hash (a long
    /// retention's, kept compact) answers `HMGET` with a scan of the whole hash per field, and
    /// `HGETALL` with one scan.
    pub whole: bool,
}

/// One `ZRANGEBYLEX key min max LIMIT 0 count`: an index read by range.
pub struct LexRange<'a> {
    pub key: &'a [u8],
    pub min: &'a [u8],
    pub max: &'a [u8],
    pub count: usize,
}

/// The members of one range, in one buffer (no allocation a member).
#[derive(Debug, Default)]
pub struct Members {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Members {
    pub fn push(&mut self, member: &[u8]) {
        self.bytes.extend_from_slice(member);
        self.ends.push(self.bytes.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(a, &b)| &self.bytes[a..b])
    }

    pub fn last(&self) -> Option<&[u8]> {
        let end = *self.ends.last()?;
        let start = self.ends.len().checked_sub(2).map_or(0, |i| self.ends[i]);
        Some(&self.bytes[start..end])
    }
}

/// Commands for [`BulkPool::pipeline`], written as RESP as they are added.
#[derive(Debug, Default)]
pub struct Commands {
    out: Vec<u8>,
    n: usize,
    /// The bytes their replies are expected to hold, made room for before they are read.
    expected: usize,
}

impl Commands {
    pub fn push(&mut self, args: &[&[u8]]) {
        command(&mut self.out, args);
        self.n += 1;
    }

    /// [`Commands::push`] of a command whose reply is about `bytes` long.
    pub fn push_expecting(&mut self, args: &[&[u8]], bytes: usize) {
        self.push(args);
        self.expected += bytes;
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// One reply of a [`BulkPool::pipeline`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer<'a> {
    /// A bulk string's bytes (a null: empty).
    Bytes(&'a [u8]),
    Integer(i64),
}

/// The replies of a pipeline, in order, their bytes in one buffer (no allocation a reply).
#[derive(Debug, Default)]
pub struct Answers {
    bytes: Vec<u8>,
    /// Each reply: where its bytes lie in `bytes` (`Err`: an integer).
    replies: Vec<Result<(usize, usize), i64>>,
}

impl Answers {
    /// Reply `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<Answer<'_>> {
        Some(match *self.replies.get(i)? {
            Ok((start, end)) => Answer::Bytes(&self.bytes[start..end]),
            Err(n) => Answer::Integer(n),
        })
    }
}

/// Bulk connections kept between requests, each used by one request at a time.
pub struct BulkPool {
    target: Option<BulkTarget>,
    idle: std::sync::Mutex<Vec<Bulk>>,
    max_idle: usize,
    /// Whether Redis takes `MULTI` from this user ([`Bulk::hmget`]): false once refused.
    multi: std::sync::atomic::AtomicBool,
}

impl BulkPool {
    /// A pool for `target` that keeps up to `max_idle` connections between requests (one per
    /// request that may run at once); without a target (Sentinel, Cluster, TLS) it reads
    /// nothing.
    pub fn new(target: Option<BulkTarget>, max_idle: usize) -> BulkPool {
        BulkPool {
            target,
            idle: Default::default(),
            max_idle,
            multi: true.into(),
        }
    }

    pub fn available(&self) -> bool {
        self.target.is_some()
    }

    /// [`Bulk::hmget`] on a kept or new connection ([`BulkPool::read`]).
    pub async fn hmget(&self, requests: &[Hmget<'_>]) -> Result<Vec<Vec<Point>>, StoreError> {
        Ok(self.hmget_then(requests, None).await?.0)
    }

    /// [`Bulk::hmget`] and then, in the same write, `then`'s commands: their replies as
    /// [`BulkPool::pipeline`] gives them.
    pub async fn hmget_then(
        &self,
        requests: &[Hmget<'_>],
        then: Option<&Commands>,
    ) -> Result<(Vec<Vec<Point>>, Option<Answers>), StoreError> {
        self.read(|mut bulk| {
            Box::pin(async move {
                let read = bulk.hmget(requests, then, &self.multi).await;
                (bulk, read)
            })
        })
        .await
    }

    /// [`Bulk::lex_ranges`] on a kept or new connection ([`BulkPool::read`]).
    pub async fn lex_ranges(&self, requests: &[LexRange<'_>]) -> Result<Vec<Members>, StoreError> {
        self.read(|mut bulk| {
            Box::pin(async move {
                let read = bulk.lex_ranges(requests).await;
                (bulk, read)
            })
        })
        .await
    }

    /// [`Bulk::pipeline`] on a kept or new connection ([`BulkPool::read`]).
    pub async fn pipeline(&self, commands: &Commands) -> Result<Answers, StoreError> {
        self.read(|mut bulk| {
            Box::pin(async move {
                let read = bulk.pipeline(commands).await;
                (bulk, read)
            })
        })
        .await
    }

    /// `read` on an idle connection, or a new one. A kept connection may have been closed
    /// meanwhile (Redis restarted, a timeout): a read on it that fails is made once more on a
    /// new one. A connection that answered is kept idle (a few at most).
    async fn read<'r, T>(
        &self,
        read: impl Fn(Bulk) -> BoxFuture<'r, (Bulk, Result<T, StoreError>)>,
    ) -> Result<T, StoreError> {
        let idle = self.idle.lock().map(|mut i| i.pop()).unwrap_or(None);
        let (bulk, out) = match idle {
            Some(kept) => match read(kept).await {
                (_, Err(_)) => read(self.connect().await?).await,
                answered => answered,
            },
            None => read(self.connect().await?).await,
        };
        let out = out?;
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < self.max_idle
        {
            idle.push(bulk);
        }
        Ok(out)
    }

    async fn connect(&self) -> Result<Bulk, StoreError> {
        let Some(target) = &self.target else {
            return Err(protocol("no bulk reader for this topology"));
        };
        Bulk::connect(target).await
    }
}

/// The warning, once, when Redis refuses a reader `MULTI`.
pub const MULTI_REFUSED: &str = "Redis refused MULTI: reads of a long archive's hashes and \
    blocks go apart, and a slice the cleaner moves between the two is read twice; the user \
    needs +multi +exec (docs/operations.md, \"A Redis user of least privilege\")";

/// What the socket gives at most per read: a day of minutes for a few series.
const READ_SIZE: usize = 256 * 1024;

/// A connection that answers pipelined `HMGET`s.
pub struct Bulk {
    read: Box<dyn AsyncRead + Unpin + Send>,
    write: Box<dyn AsyncWrite + Unpin + Send>,
    timeout: Duration,
}

impl Bulk {
    /// Connects, logs in and selects the database, within the target's timeout.
    pub async fn connect(target: &BulkTarget) -> Result<Bulk, StoreError> {
        let connecting = async {
            let (read, write): (
                Box<dyn AsyncRead + Unpin + Send>,
                Box<dyn AsyncWrite + Unpin + Send>,
            ) = match &target.addr {
                BulkAddr::Tcp(host, port) => {
                    let s = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                    s.set_nodelay(true)?;
                    let (r, w) = s.into_split();
                    (Box::new(r), Box::new(w))
                }
                BulkAddr::Unix(path) => {
                    let (r, w) = tokio::net::UnixStream::connect(path).await?.into_split();
                    (Box::new(r), Box::new(w))
                }
            };
            let mut bulk = Bulk {
                read,
                write,
                timeout: target.timeout,
            };
            let mut hello: Vec<Vec<&[u8]>> = Vec::new();
            if let Some(password) = &target.password {
                let mut auth: Vec<&[u8]> = vec![b"AUTH"];
                if let Some(user) = &target.username {
                    auth.push(user.as_bytes());
                }
                auth.push(password.as_bytes());
                hello.push(auth);
            }
            let db = target.db.to_string();
            if target.db != 0 {
                hello.push(vec![b"SELECT", db.as_bytes()]);
            }
            if !hello.is_empty() {
                let mut out = Vec::new();
                for c in &hello {
                    command(&mut out, c);
                }
                bulk.write.write_all(&out).await?;
                let mut replies = Replies::new(&mut bulk.read, target.timeout);
                for _ in &hello {
                    replies.status().await?;
                }
            }
            Ok::<_, StoreError>(bulk)
        };
        tokio::time::timeout(target.timeout, connecting)
            .await
            .map_err(|_| StoreError::Timeout(target.timeout))?
    }

    /// Each `HMGET`'s values as numbers (a field that is missing or no number: `None`), in
    /// order, and then the replies to `then`'s commands, written after them ([`Bulk::pipeline`]'s
    /// answers). The commands are written while the replies are read, so neither side's buffers
    /// hold the whole of either; a read that waits longer than the timeout fails.
    ///
    /// With `then` (a long archive's blocks), all of them are one transaction (`MULTI` …
    /// `EXEC`) while `multi` holds: the cleaner moves a slice from its hash into its block in
    /// one call, and a read of the hash before that call and of the block after it would count
    /// the slice twice (docs/layout.md, "History: fixed slots", Reads). A user refused `MULTI`
    /// (a reader made by an earlier release's ACL line) is answered each command as it comes,
    /// as before, and `multi` is cleared, with a warning.
    pub async fn hmget(
        &mut self,
        requests: &[Hmget<'_>],
        then: Option<&Commands>,
        multi: &std::sync::atomic::AtomicBool,
    ) -> Result<(Vec<Vec<Point>>, Option<Answers>), StoreError> {
        use std::sync::atomic::Ordering::Relaxed;
        let timeout = self.timeout;
        let write = &mut self.write;
        let atomic =
            then.is_some_and(|t| !t.is_empty()) && !requests.is_empty() && multi.load(Relaxed);
        let writing = async move {
            let mut out = Vec::with_capacity(64 * 1024);
            if atomic {
                out.extend_from_slice(b"*1\r\n$5\r\nMULTI\r\n");
            }
            // The fields' text, made once for the requests that share them (a render's series
            // mostly do: one range, one precision).
            let mut fields: (&[i64], Vec<u8>) = (&[], Vec::new());
            for r in requests {
                if r.whole {
                    out.extend_from_slice(b"*2\r\n$7\r\nHGETALL\r\n");
                } else {
                    if r.fields != fields.0 {
                        fields.0 = r.fields;
                        fields.1.clear();
                        arguments(&mut fields.1, r.fields);
                    }
                    header(&mut out, b'*', r.fields.len() + 2);
                    out.extend_from_slice(b"$5\r\nHMGET\r\n");
                }
                header(&mut out, b'$', r.key.len());
                out.extend_from_slice(r.key);
                out.extend_from_slice(b"\r\n");
                if !r.whole {
                    out.extend_from_slice(&fields.1);
                }
                if out.len() >= 64 * 1024 {
                    write.write_all(&out).await?;
                    out.clear();
                }
            }
            if let Some(then) = then {
                out.extend_from_slice(&then.out);
            }
            if atomic {
                out.extend_from_slice(b"*1\r\n$4\r\nEXEC\r\n");
            }
            write.write_all(&out).await?;
            write.flush().await?;
            Ok::<_, StoreError>(())
        };
        let read = &mut self.read;
        let reading = async move {
            let mut replies = Replies::new(read, timeout);
            // `+OK`, a `+QUEUED` a command, then `EXEC`'s array of their replies.
            let queued = atomic
                && match replies.line().await? {
                    (b'+', _) => true,
                    (b'-', _) => false,
                    (_, rest) => return Err(protocol(&String::from_utf8_lossy(&rest))),
                };
            if queued {
                let commands = requests.len() + then.map_or(0, |t| t.len());
                for _ in 0..commands {
                    replies.status().await?;
                }
                if replies.length(b'*').await? != commands as i64 {
                    return Err(protocol("EXEC's replies"));
                }
            } else if atomic && multi.swap(false, Relaxed) {
                tracing::warn!("{MULTI_REFUSED}");
            }
            let mut out = Vec::with_capacity(requests.len());
            for r in requests {
                let mut values = Vec::with_capacity(r.fields.len());
                if r.whole {
                    values.resize(r.fields.len(), None);
                    replies.picked(r.fields, &mut values).await?;
                } else {
                    replies.numbers(&mut values).await?;
                }
                out.push(values);
            }
            let answers = match then {
                Some(then) => Some(replies.answers(then).await?),
                None => None,
            };
            if atomic && !queued {
                // EXEC's refusal (without MULTI, or not allowed either).
                let _ = replies.status().await;
            }
            Ok::<_, StoreError>((out, answers))
        };
        let (written, read) = tokio::join!(writing, reading);
        written?;
        read
    }
}

impl Bulk {
    /// Each range's members, in order: the commands in one write, the replies read in place.
    pub async fn lex_ranges(
        &mut self,
        requests: &[LexRange<'_>],
    ) -> Result<Vec<Members>, StoreError> {
        let mut out = Vec::new();
        let mut count = itoa::Buffer::new();
        for r in requests {
            let count = count.format(r.count).as_bytes();
            command(
                &mut out,
                &[b"ZRANGEBYLEX", r.key, r.min, r.max, b"LIMIT", b"0", count],
            );
        }
        self.write.write_all(&out).await?;
        self.write.flush().await?;
        let mut replies = Replies::new(&mut self.read, self.timeout);
        let mut ranges = Vec::with_capacity(requests.len());
        for _ in requests {
            let mut members = Members::default();
            replies.strings(&mut members).await?;
            ranges.push(members);
        }
        Ok(ranges)
    }

    /// Each command's reply, bulk strings and integers (an error fails the whole read): the
    /// commands in one write, the replies copied out of the socket's buffer into one.
    pub async fn pipeline(&mut self, commands: &Commands) -> Result<Answers, StoreError> {
        self.write.write_all(&commands.out).await?;
        self.write.flush().await?;
        Replies::new(&mut self.read, self.timeout)
            .answers(commands)
            .await
    }
}

/// `*n $len arg …`, RESP's form of a command.
fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    header(out, b'*', args.len());
    for a in args {
        header(out, b'$', a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Numbers as RESP bulk strings.
fn arguments(out: &mut Vec<u8>, numbers: &[i64]) {
    let mut digits = itoa::Buffer::new();
    for n in numbers {
        let d = digits.format(*n).as_bytes();
        header(out, b'$', d.len());
        out.extend_from_slice(d);
        out.extend_from_slice(b"\r\n");
    }
}

fn header(out: &mut Vec<u8>, kind: u8, n: usize) {
    out.push(kind);
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A reply that is not the shape its command gives.
pub(crate) fn protocol(what: &str) -> StoreError {
    StoreError::Redis(redis::RedisError::from((
        redis::ErrorKind::Parse,
        "an unexpected reply",
        what.to_string(),
    )))
}

/// Replies read from a socket into a buffer and parsed where they lie; a read that waits
/// longer than `timeout` fails.
struct Replies<'r, R> {
    read: &'r mut R,
    buf: Vec<u8>,
    at: usize,
    timeout: Duration,
}

impl<'r, R: AsyncRead + Unpin> Replies<'r, R> {
    fn new(read: &'r mut R, timeout: Duration) -> Self {
        Replies {
            read,
            buf: Vec::with_capacity(READ_SIZE),
            at: 0,
            timeout,
        }
    }

    /// Reads until at least `n` bytes past `at` are buffered.
    async fn want(&mut self, n: usize) -> Result<(), StoreError> {
        while self.buf.len() - self.at < n {
            if self.at > 0 {
                self.buf.drain(..self.at);
                self.at = 0;
            }
            self.buf.reserve(READ_SIZE.max(n));
            let got = tokio::time::timeout(self.timeout, self.read.read_buf(&mut self.buf))
                .await
                .map_err(|_| StoreError::Timeout(self.timeout))??;
            if got == 0 {
                return Err(StoreError::Redis(
                    std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into(),
                ));
            }
        }
        Ok(())
    }

    /// One line's kind and what follows it up to `\r\n`, consumed.
    async fn line(&mut self) -> Result<(u8, Vec<u8>), StoreError> {
        loop {
            if let Some(end) = line_end(&self.buf[self.at..]) {
                let line = &self.buf[self.at..self.at + end];
                let kind = *line.first().ok_or_else(|| protocol("an empty line"))?;
                let rest = line[1..].to_vec();
                self.at += end + 2;
                return Ok((kind, rest));
            }
            let have = self.buf.len() - self.at;
            self.want(have + 1).await?;
        }
    }

    /// A length after `*` or `$`; -1 for a null.
    async fn length(&mut self, kind: u8) -> Result<i64, StoreError> {
        // The common case read where it lies; anything else (an error) through `line`.
        loop {
            if let Some(end) = line_end(&self.buf[self.at..]) {
                let line = &self.buf[self.at..self.at + end];
                let n = (line.first() == Some(&kind))
                    .then(|| std::str::from_utf8(&line[1..]).ok()?.parse().ok())
                    .flatten();
                if let Some(n) = n {
                    self.at += end + 2;
                    return Ok(n);
                }
                break;
            }
            let have = self.buf.len() - self.at;
            self.want(have + 1).await?;
        }
        let (k, rest) = self.line().await?;
        match k {
            b'-' => Err(StoreError::Redis(redis::RedisError::from((
                redis::ErrorKind::Extension,
                "Redis refused",
                String::from_utf8_lossy(&rest).into_owned(),
            )))),
            k if k == kind => std::str::from_utf8(&rest)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| protocol("a length")),
            _ => Err(protocol(&String::from_utf8_lossy(&rest))),
        }
    }

    /// `+OK` (or an error).
    async fn status(&mut self) -> Result<(), StoreError> {
        match self.line().await? {
            (b'+', _) => Ok(()),
            (b'-', rest) => Err(StoreError::Redis(redis::RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "Redis refused",
                String::from_utf8_lossy(&rest).into_owned(),
            )))),
            (_, rest) => Err(protocol(&String::from_utf8_lossy(&rest))),
        }
    }

    /// An array of bulk strings, each as a number.
    async fn numbers(&mut self, out: &mut Vec<Point>) -> Result<(), StoreError> {
        let n = self.length(b'*').await?;
        for _ in 0..n.max(0) {
            // The common case, `$<len>\r\n<digits>\r\n` all buffered, without an await.
            if let Some((value, used)) = bulk_number(&self.buf[self.at..]) {
                out.push(value);
                self.at += used;
                continue;
            }
            let len = self.length(b'$').await?;
            if len < 0 {
                out.push(None);
                continue;
            }
            let len = len as usize;
            self.want(len + 2).await?;
            out.push(number(&self.buf[self.at..self.at + len]));
            self.at += len + 2;
        }
        Ok(())
    }

    /// The values of `fields` (ascending) among an `HGETALL` reply's field, value pairs, as
    /// numbers, into `out` (as long as `fields`): a field that is no slice time is passed over,
    /// and only the values asked for are read as numbers (a rollup asks an hour's minutes of a
    /// hash of two hours, a day's hours of five days').
    async fn picked(&mut self, fields: &[i64], out: &mut [Point]) -> Result<(), StoreError> {
        let n = self.length(b'*').await?;
        let mut wanted = None;
        // A hash gives its fields in the order they were made, mostly oldest first: the field
        // after one asked is likeliest the next one asked, found without a search (a binary
        // search a field was most of a render's parsing).
        let mut next = 0;
        for i in 0..n.max(0) {
            // The common case, all buffered, without an await.
            let span = match bulk_span(&self.buf[self.at..]) {
                Some((span, used)) => {
                    let span = span.map(|(from, to)| (self.at + from, self.at + to));
                    self.at += used;
                    span
                }
                None => {
                    let len = self.length(b'$').await?;
                    if len < 0 {
                        None
                    } else {
                        let len = len as usize;
                        self.want(len + 2).await?;
                        self.at += len + 2;
                        Some((self.at - len - 2, self.at - 2))
                    }
                }
            };
            let bytes = span.map(|(from, to)| &self.buf[from..to]);
            if i % 2 == 0 {
                wanted = bytes
                    .and_then(slice_time)
                    .and_then(|t| match fields.get(next) {
                        Some(&field) if field == t => Some(next),
                        _ => fields.binary_search(&t).ok(),
                    });
                if let Some(k) = wanted {
                    next = k + 1;
                }
            } else if let Some(k) = wanted.take() {
                out[k] = bytes.and_then(number);
            }
        }
        Ok(())
    }

    /// The replies to `commands`.
    async fn answers(&mut self, commands: &Commands) -> Result<Answers, StoreError> {
        let mut answers = Answers {
            bytes: Vec::with_capacity(commands.expected),
            replies: Vec::with_capacity(commands.n),
        };
        for _ in 0..commands.n {
            self.answer(&mut answers).await?;
        }
        Ok(answers)
    }

    /// A bulk string (its bytes copied into `out`) or an integer.
    async fn answer(&mut self, out: &mut Answers) -> Result<(), StoreError> {
        self.want(1).await?;
        if self.buf[self.at] == b':' {
            let (_, rest) = self.line().await?;
            let n = std::str::from_utf8(&rest)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| protocol("an integer"))?;
            out.replies.push(Err(n));
            return Ok(());
        }
        let len = self.length(b'$').await?;
        let start = out.bytes.len();
        if len >= 0 {
            let len = len as usize;
            self.want(len + 2).await?;
            out.bytes
                .extend_from_slice(&self.buf[self.at..self.at + len]);
            self.at += len + 2;
        }
        out.replies.push(Ok((start, out.bytes.len())));
        Ok(())
    }

    /// An array of bulk strings, each added to `out` as it is.
    async fn strings(&mut self, out: &mut Members) -> Result<(), StoreError> {
        let n = self.length(b'*').await?;
        for _ in 0..n.max(0) {
            let len = self.length(b'$').await?;
            if len < 0 {
                return Err(protocol("a null member"));
            }
            let len = len as usize;
            self.want(len + 2).await?;
            out.push(&self.buf[self.at..self.at + len]);
            self.at += len + 2;
        }
        Ok(())
    }
}

/// One whole array reply at the start of `reply`, its values as numbers, and its length;
/// `None` unless all of it is there in this form (what [`Bulk::hmget`] reads the quick way;
/// for the benchmarks and tests).
pub fn numbers_in(reply: &[u8]) -> Option<(Vec<Point>, usize)> {
    let end = line_end(reply)?;
    if reply.first() != Some(&b'*') {
        return None;
    }
    let n: usize = std::str::from_utf8(&reply[1..end]).ok()?.parse().ok()?;
    let mut at = end + 2;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (v, used) = bulk_number(&reply[at..])?;
        out.push(v);
        at += used;
    }
    Some((out, at))
}

/// Where the first `\r\n` in `b` starts (a line of RESP is short: a search for `\n` is
/// cheaper than building a two-byte finder).
fn line_end(b: &[u8]) -> Option<usize> {
    let mut from = 0;
    loop {
        let n = from + memchr::memchr(b'\n', &b[from..])?;
        if n > 0 && b[n - 1] == b'\r' {
            return Some(n - 1);
        }
        from = n + 1;
    }
}

/// A whole bulk string at the start of `b` (`$-1\r\n` a null), as a number, and its length;
/// `None` unless all of it is there.
fn bulk_number(b: &[u8]) -> Option<(Point, usize)> {
    let (span, used) = bulk_span(b)?;
    Some((span.and_then(|(from, to)| number(&b[from..to])), used))
}

/// Where the text of a whole bulk string at the start of `b` lies (`None` for `$-1\r\n`, a
/// null), and its length; `None` unless all of it is there.
fn bulk_span(b: &[u8]) -> Option<(Option<(usize, usize)>, usize)> {
    if b.first() != Some(&b'$') {
        return None;
    }
    if b.starts_with(b"$-1\r\n") {
        return Some((None, 5));
    }
    let mut len = 0usize;
    let mut i = 1;
    while let Some(&d) = b.get(i) {
        if d.is_ascii_digit() {
            len = len * 10 + usize::from(d - b'0');
            i += 1;
        } else {
            break;
        }
    }
    if i == 1 || b.get(i..i + 2) != Some(b"\r\n") {
        return None;
    }
    let start = i + 2;
    let end = start + len;
    if b.get(end..end + 2) != Some(b"\r\n") {
        return None;
    }
    Some((Some((start, end)), end + 2))
}

/// Up to 15 digits (no sign) as the integer they write; `None` for anything else.
fn digits(bytes: &[u8]) -> Option<i64> {
    (!bytes.is_empty() && bytes.len() < 16 && bytes.iter().all(u8::is_ascii_digit))
        .then(|| bytes.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
}

/// A field's text as a slice time (a whole number of seconds): digits the quick way, anything
/// else as [`number`] reads it, `None` unless whole.
fn slice_time(bytes: &[u8]) -> Option<i64> {
    digits(bytes).or_else(|| number(bytes).filter(|f| f.fract() == 0.0).map(|f| f as i64))
}

/// A value's text as a number: integers (counts) the quick way, anything else as Rust reads a
/// float; text that is no number is `None`.
pub fn number(bytes: &[u8]) -> Point {
    match bytes.strip_prefix(b"-") {
        Some(rest) => digits(rest).map(|n| -n as f64),
        None => digits(bytes).map(|n| n as f64),
    }
    .or_else(|| std::str::from_utf8(bytes).ok()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_strings_parse_in_place_or_wait_for_the_rest() {
        assert_eq!(bulk_number(b"$2\r\n42\r\nrest"), Some((Some(42.0), 8)));
        assert_eq!(bulk_number(b"$-1\r\n"), Some((None, 5)));
        assert_eq!(bulk_number(b"$4\r\n-1.5\r\n"), Some((Some(-1.5), 10)));
        assert_eq!(bulk_number(b"$3\r\nabc\r\n"), Some((None, 9)));
        assert_eq!(bulk_number(b"$2\r\n4"), None);
        assert_eq!(bulk_number(b"$12"), None);
        assert_eq!(bulk_number(b"*2\r\n"), None);
    }

    #[test]
    fn a_whole_reply_in_a_buffer() {
        let reply = b"*3\r\n$1\r\n1\r\n$-1\r\n$3\r\n2.5\r\nnext";
        assert_eq!(
            numbers_in(reply),
            Some((vec![Some(1.0), None, Some(2.5)], reply.len() - 4))
        );
        assert_eq!(numbers_in(&reply[..10]), None);
    }

    #[test]
    fn numbers_as_the_api_reads_them() {
        assert_eq!(number(b"7"), Some(7.0));
        assert_eq!(number(b"-12"), Some(-12.0));
        assert_eq!(number(b"0.30000000000000004"), Some(0.30000000000000004));
        assert_eq!(
            number(b"12345678901234567890"),
            Some(12345678901234567890.0)
        );
        assert_eq!(number(b"x"), None);
        assert_eq!(number(b""), None);
    }

    #[test]
    fn numbers_are_written_as_resp_bulk_strings() {
        let mut out = Vec::new();
        command(&mut out, &[b"HMGET", b"count:60:a"]);
        arguments(&mut out, &[60, -120]);
        assert_eq!(
            out,
            b"*2\r\n$5\r\nHMGET\r\n$10\r\ncount:60:a\r\n$2\r\n60\r\n$4\r\n-120\r\n"
        );
    }

    /// Replies cut anywhere across reads parse alike.
    #[tokio::test]
    async fn replies_split_across_reads_parse_alike() {
        let reply = b"*4\r\n$2\r\n42\r\n$-1\r\n$3\r\n1.5\r\n$1\r\nx\r\n*1\r\n$1\r\n7\r\n";
        for chunk in [1, 2, 3, 5, 7, 64] {
            let mut reader = tokio_test_reader(reply, chunk);
            let mut replies = Replies::new(&mut reader, Duration::from_secs(1));
            let mut first = Vec::new();
            replies.numbers(&mut first).await.unwrap();
            let mut second = Vec::new();
            replies.numbers(&mut second).await.unwrap();
            assert_eq!(first, [Some(42.0), None, Some(1.5), None], "chunk {chunk}");
            assert_eq!(second, [Some(7.0)], "chunk {chunk}");
        }
    }

    /// An `HGETALL` reply cut anywhere across reads: the values of the fields asked, each
    /// where its field is among them, whatever the reply's order; a field that is no slice
    /// time, or not asked, is passed over, and a value that is no number is none.
    #[tokio::test]
    async fn whole_hashes_give_the_fields_asked() {
        let reply = b"*12\r\n$3\r\n120\r\n$3\r\n2.5\r\n$2\r\n60\r\n$1\r\n7\r\n\
            $4\r\n60.5\r\n$1\r\n9\r\n$1\r\nx\r\n$1\r\n8\r\n$3\r\n180\r\n$3\r\nabc\r\n\
            $2\r\n30\r\n$2\r\n-4\r\n*0\r\n";
        for chunk in [1, 2, 3, 5, 7, 64] {
            let mut reader = tokio_test_reader(reply, chunk);
            let mut replies = Replies::new(&mut reader, Duration::from_secs(1));
            let mut values = vec![None; 4];
            replies
                .picked(&[0, 60, 120, 180], &mut values)
                .await
                .unwrap();
            assert_eq!(values, [None, Some(7.0), Some(2.5), None], "chunk {chunk}");
            let mut none = vec![None; 1];
            replies.picked(&[60], &mut none).await.unwrap();
            assert_eq!(none, [None], "chunk {chunk}");
        }
    }

    /// A hash's fields in the order they were made (oldest first, as most are): each found where
    /// the one before it ends, as a search would find it, a field written otherwise (`1.8e2`)
    /// too.
    #[tokio::test]
    async fn fields_in_order_are_placed_as_a_search_places_them() {
        let reply = b"*12\r\n$1\r\n0\r\n$1\r\n1\r\n$2\r\n60\r\n$1\r\n2\r\n\
            $3\r\n120\r\n$1\r\n3\r\n$5\r\n1.8e2\r\n$1\r\n4\r\n$3\r\n240\r\n$1\r\n5\r\n\
            $3\r\n300\r\n$1\r\n6\r\n";
        for chunk in [1, 3, 64] {
            let mut reader = tokio_test_reader(reply, chunk);
            let mut replies = Replies::new(&mut reader, Duration::from_secs(1));
            let mut values = vec![None; 4];
            replies
                .picked(&[60, 120, 180, 240], &mut values)
                .await
                .unwrap();
            let expected = [Some(2.0), Some(3.0), Some(4.0), Some(5.0)];
            assert_eq!(values, expected, "chunk {chunk}");
        }
        assert_eq!(slice_time(b"1764469200"), Some(1_764_469_200));
        assert_eq!(slice_time(b"-60"), Some(-60));
        assert_eq!(slice_time(b"60.0"), Some(60));
        assert_eq!(slice_time(b"60.5"), None);
        assert_eq!(slice_time(b""), None);
        assert_eq!(slice_time(b"x"), None);
    }

    #[tokio::test]
    async fn a_pipeline_after_hmgets_is_read_from_where_their_replies_end() {
        // An HMGET's two values, a whole hash's two fields, then two blocks' bytes: however the
        // socket cuts them, the blocks' replies start in the buffer the hashes' were read from.
        // As one transaction's (MULTI's `+OK`, four `+QUEUED`, EXEC's array of the four), and as
        // a user refused MULTI gets them (each reply as it comes, EXEC refused too), after which
        // the pool sends no more MULTI.
        const ATOMIC: &[u8] = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*4\r\n\
            *2\r\n$1\r\n5\r\n$-1\r\n\
            *4\r\n$2\r\n60\r\n$1\r\n7\r\n$3\r\n120\r\n$2\r\n-1\r\n\
            $3\r\n\x80\r\n\r\n$-1\r\n";
        const REFUSED: &[u8] = b"-NOPERM no 'multi'\r\n\
            *2\r\n$1\r\n5\r\n$-1\r\n\
            *4\r\n$2\r\n60\r\n$1\r\n7\r\n$3\r\n120\r\n$2\r\n-1\r\n\
            $3\r\n\x80\r\n\r\n$-1\r\n\
            -NOPERM no 'exec'\r\n";
        let mut blocks = Commands::default();
        blocks.push_expecting(&[b"GETRANGE", b"b1", b"0", b"64"], 65);
        blocks.push_expecting(&[b"GETRANGE", b"b2", b"0", b"64"], 65);
        for ((reply, taken), chunk) in [(ATOMIC, true), (REFUSED, false)]
            .into_iter()
            .flat_map(|r| [1, 2, 3, 5, 7, 64].map(|c| (r, c)))
        {
            let multi = std::sync::atomic::AtomicBool::new(true);
            let mut bulk = Bulk {
                read: Box::new(tokio_test_reader(reply, chunk)),
                write: Box::new(tokio::io::sink()),
                timeout: Duration::from_secs(1),
            };
            let requests = [
                Hmget {
                    key: b"h1",
                    fields: &[0, 10],
                    whole: false,
                },
                Hmget {
                    key: b"h2",
                    fields: &[0, 60, 120],
                    whole: true,
                },
            ];
            let (values, answers) = bulk.hmget(&requests, Some(&blocks), &multi).await.unwrap();
            assert_eq!(multi.into_inner(), taken, "chunk {chunk}");
            assert_eq!(
                values,
                [vec![Some(5.0), None], vec![None, Some(7.0), Some(-1.0)]],
                "chunk {chunk}"
            );
            let answers = answers.expect("the blocks' replies");
            let read: Vec<_> = (0..3).map(|i| answers.get(i)).collect();
            assert_eq!(
                read,
                [
                    Some(Answer::Bytes(b"\x80\r\n")),
                    Some(Answer::Bytes(b"")),
                    None
                ],
                "chunk {chunk}"
            );
        }
    }

    #[tokio::test]
    async fn pipelined_replies_split_across_reads_parse_alike() {
        // A block's bytes (with a `\r\n` inside), a missing block, a null, an EXISTS count,
        // then a refusal.
        let reply = b"$5\r\n\x80\r\n\x00\xff\r\n$0\r\n\r\n$-1\r\n:2\r\n-WRONGTYPE no\r\n";
        for chunk in [1, 2, 3, 5, 7, 64] {
            let mut reader = tokio_test_reader(reply, chunk);
            let mut replies = Replies::new(&mut reader, Duration::from_secs(1));
            let mut answers = Answers::default();
            for _ in 0..4 {
                replies.answer(&mut answers).await.unwrap();
            }
            let read: Vec<_> = (0..5).map(|i| answers.get(i)).collect();
            assert_eq!(
                read,
                [
                    Some(Answer::Bytes(b"\x80\r\n\x00\xff")),
                    Some(Answer::Bytes(b"")),
                    Some(Answer::Bytes(b"")),
                    Some(Answer::Integer(2)),
                    None
                ],
                "chunk {chunk}"
            );
            let refused = replies.answer(&mut answers).await;
            assert!(
                matches!(refused, Err(StoreError::Redis(ref e)) if e.to_string().contains("no")),
                "{refused:?}"
            );
        }
    }

    /// Index members (with `\r` inside a member, and a `\n` alone) cut anywhere across reads
    /// parse alike; an error reply is Redis's refusal.
    #[tokio::test]
    async fn members_split_across_reads_parse_alike() {
        let reply = b"*3\r\n$6\r\n60:a.b\r\n$4\r\n1:\rx\r\n$3\r\n\ny.\r\n*0\r\n-ERR no\r\n";
        for chunk in [1, 2, 3, 5, 7, 64] {
            let mut reader = tokio_test_reader(reply, chunk);
            let mut replies = Replies::new(&mut reader, Duration::from_secs(1));
            let (mut first, mut second) = (Members::default(), Members::default());
            replies.strings(&mut first).await.unwrap();
            replies.strings(&mut second).await.unwrap();
            let members: Vec<&[u8]> = first.iter().collect();
            assert_eq!(
                members,
                [&b"60:a.b"[..], b"1:\rx", b"\ny."],
                "chunk {chunk}"
            );
            assert_eq!(first.last(), Some(&b"\ny."[..]));
            assert!(second.is_empty() && second.last().is_none());
            let refused = replies.strings(&mut second).await;
            assert!(
                matches!(refused, Err(StoreError::Redis(ref e)) if e.to_string().contains("no")),
                "{refused:?}"
            );
        }
    }

    /// A reader that gives `chunk` bytes a read.
    fn tokio_test_reader(bytes: &'static [u8], chunk: usize) -> impl AsyncRead + Unpin {
        struct Chunks(&'static [u8], usize);
        impl AsyncRead for Chunks {
            fn poll_read(
                mut self: std::pin::Pin<&mut Self>,
                _: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                let n = self.1.min(self.0.len()).min(buf.remaining());
                let (now, rest) = self.0.split_at(n);
                buf.put_slice(now);
                self.0 = rest;
                std::task::Poll::Ready(Ok(()))
            }
        }
        Chunks(bytes, chunk)
    }
}
