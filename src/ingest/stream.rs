//! Stream listeners, TCP and unix: newline-delimited lines over many connections, each read by
//! a task of its own into its listener's window.
//!
//! Bounds, so that no client can take the agent's memory or descriptors: a line longer than
//! `max_datagram_bytes` is dropped up to its newline and counted (`line_too_long`), the
//! connection going on; at most `max_connections` are open per listener (one more is closed at
//! once and counted); `stream_idle_timeout_secs` closes a silent one (off by default).
//!
//! What a connection delivers is recorded line by line: a line split across reads is joined,
//! `\r\n` is accepted, and the last line of a connection the client closes needs no newline.
//! On a stop the listener stops accepting and every connection records what it has already
//! received (a partial last line is counted as `truncated`, since the rest may still be on its
//! way), before the final flush.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{BadLineLog, LineHandler, SocketFile, Transport};
use crate::aggregate::Window;
use crate::protocol::BadLine;
use crate::telemetry::{LogLimit, Telemetry};

/// Bytes asked of the socket per read.
const READ_BYTES: usize = 64 << 10;

/// A bound stream listener.
#[derive(Debug)]
pub enum Listener {
    /// StatsD's (`Transport::Tcp`) or carbon's (`Transport::CarbonTcp`) lines.
    Tcp(std::net::TcpListener, Transport),
    /// The socket file is removed when the listener's task ends.
    Unix(std::os::unix::net::UnixListener, SocketFile),
}

impl Listener {
    /// A TCP listener of `transport`'s lines (`Tcp`, `CarbonTcp`, `CarbonPickle`).
    pub fn bind_tcp(addr: std::net::SocketAddr, transport: Transport) -> io::Result<Listener> {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
        if addr.is_ipv6() && addr.ip().is_unspecified() {
            // `:8125`: every interface of both families, whatever net.ipv6.bindv6only says.
            socket.set_only_v6(false)?;
        }
        socket.set_reuse_address(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        socket.set_nonblocking(true)?;
        Ok(Listener::Tcp(socket.into(), transport))
    }

    /// Creates the unix stream socket `path` (a stale one is replaced) with `mode` permissions.
    pub fn bind_unix(path: &std::path::Path, mode: u32) -> io::Result<Listener> {
        use std::os::unix::net::{UnixListener, UnixStream};
        let probe = |p: &std::path::Path| UnixStream::connect(p).map(drop);
        let (listener, file) = SocketFile::bind(path, mode, probe, |p| UnixListener::bind(p))?;
        listener.set_nonblocking(true)?;
        Ok(Listener::Unix(listener, file))
    }

    pub fn transport(&self) -> Transport {
        match self {
            Listener::Tcp(_, transport) => *transport,
            Listener::Unix(..) => Transport::Unix,
        }
    }
}

/// What every connection of a listener shares.
#[derive(Clone)]
pub struct Settings {
    pub window: Arc<Mutex<Window>>,
    pub telemetry: Arc<Telemetry>,
    pub sanitize_names: bool,
    pub max_series: usize,
    pub max_line_bytes: usize,
    /// The longest carbon pickle message (`carbon_pickle_max_bytes`).
    pub max_pickle_bytes: usize,
    pub max_connections: usize,
    /// None: never.
    pub idle_timeout: Option<Duration>,
    pub bad_lines: Arc<BadLineLog>,
    /// The filters, shared with the other readers.
    pub rules: Arc<super::rules::SharedRules>,
    /// Where received lines are relayed (`relay`), if anywhere.
    pub relay: Option<Arc<super::relay::Relay>>,
}

/// Registers the listener with the runtime (the step that can fail, done before anything is
/// spawned) and returns the task that accepts connections until `stop`, each read by a task on
/// `tracker`; the stop reaches them through the same token. The task ends once the listener is
/// closed (connections may still be draining: wait on the tracker).
pub fn serve(
    listener: Listener,
    settings: Settings,
    tracker: TaskTracker,
    stop: CancellationToken,
) -> io::Result<impl std::future::Future<Output = ()>> {
    let transport = listener.transport();
    let (tcp, unix) = match listener {
        Listener::Tcp(l, _) => (Some(tokio::net::TcpListener::from_std(l)?), None),
        Listener::Unix(l, file) => (None, Some((tokio::net::UnixListener::from_std(l)?, file))),
    };
    Ok(async move {
        if let Some(l) = tcp {
            let accept = || async {
                let (s, _) = l.accept().await?;
                // Finds peers that vanished without a FIN (no idle timeout by default).
                let keepalive = socket2::TcpKeepalive::new()
                    .with_time(Duration::from_secs(60))
                    .with_interval(Duration::from_secs(10));
                let _ = socket2::SockRef::from(&s).set_tcp_keepalive(&keepalive);
                Ok(s)
            };
            accept_loop(accept, transport, settings, tracker, stop).await;
        } else if let Some((l, file)) = unix {
            let accept = || async { Ok(l.accept().await?.0) };
            accept_loop(accept, transport, settings, tracker, stop).await;
            drop(file);
        }
    })
}

async fn accept_loop<S, F, Fut>(
    accept: F,
    transport: Transport,
    settings: Settings,
    tracker: TaskTracker,
    stop: CancellationToken,
) where
    S: AsyncRead + Unpin + Send + 'static,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = io::Result<S>>,
{
    let counts = settings.telemetry.connections(transport);
    // At the limit the listener stops accepting until a connection closes: new ones wait in
    // the kernel's backlog (their lines kept) instead of being accepted and closed (lost).
    let permits = Arc::new(tokio::sync::Semaphore::new(settings.max_connections));
    let mut failed_log = LogLimit::default();
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                counts.at_limit.increment(1);
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => None,
                    permit = permits.clone().acquire_owned() => permit.ok(),
                }
            }
        };
        let stream = tokio::select! {
            biased;
            // After the stop, the connections the kernel completed before it are still taken
            // (their lines were sent), past the limit too, without waiting for new ones. (Not
            // held back by the task's cooperative budget: the accept is polled unconstrained.)
            _ = stop.cancelled() => {
                let pending = tokio::task::unconstrained(accept());
                match tokio::time::timeout(Duration::ZERO, pending).await {
                    Ok(Ok(s)) => Ok(s),
                    _ => return,
                }
            }
            accepted = accept() => accepted,
        };
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, most likely: wait instead of spinning, log now and then.
                if let Some(times) = failed_log.occurred() {
                    tracing::warn!(transport = transport.as_str(), error = %e, times, "accept failed (times: since the last such line)");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        counts.accepted.increment(1);
        counts.open.increment(1.0);
        let (settings, stop) = (settings.clone(), stop.clone());
        tracker.spawn(async move {
            read_connection(stream, transport, &settings, &stop).await;
            drop(permit);
            settings
                .telemetry
                .connections(transport)
                .open
                .decrement(1.0);
        });
    }
}

/// Lines of one connection: bytes after the last newline wait for the rest of their line.
struct Framer {
    handler: LineHandler,
    pending: Vec<u8>,
    /// Dropping the rest of a line that grew past the limit, up to its newline.
    skipping: bool,
    max_line_bytes: usize,
    /// On a carbon pickle connection: messages, not lines, each at most this long, and the
    /// bytes of a longer one still to skip.
    pickle: Option<usize>,
    skip: usize,
}

impl Framer {
    fn new(settings: &Settings, transport: Transport) -> Framer {
        Framer {
            handler: LineHandler::new(settings.sanitize_names, settings.max_series)
                .with_rules(settings.rules.clone())
                .with_relay(settings.relay.clone())
                .for_transport(transport),
            pending: Vec::with_capacity(READ_BYTES),
            skipping: false,
            max_line_bytes: settings.max_line_bytes,
            pickle: (transport == Transport::CarbonPickle).then_some(settings.max_pickle_bytes),
            skip: 0,
        }
    }

    /// Records the whole pickle messages now in `pending` (a 4-byte big-endian length, then
    /// the message) and keeps the partial last one. A message over `max` is counted and its
    /// bytes skipped as they come; the connection goes on (carbon closes it).
    fn take_messages(&mut self, max: usize, window: &Mutex<Window>) {
        let mut pending = std::mem::take(&mut self.pending);
        let mut at = self.skip.min(pending.len());
        self.skip -= at;
        let mut locked = None;
        while let Some(head) = pending.get(at..at + 4) {
            let len = u32::from_be_bytes(head.try_into().expect("four bytes")) as usize;
            if len > max {
                self.handler.tally.lines += 1;
                self.handler.reject(BadLine::PickleTooLarge, head);
                at += 4;
                let here = len.min(pending.len() - at);
                at += here;
                self.skip = len - here;
                continue;
            }
            let Some(message) = pending.get(at + 4..at + 4 + len) else {
                break;
            };
            let window =
                locked.get_or_insert_with(|| window.lock().unwrap_or_else(|p| p.into_inner()));
            self.handler.handle_pickle(message, window);
            at += 4 + len;
        }
        drop(locked);
        pending.drain(..at);
        self.pending = pending;
    }

    /// Records the whole lines now in `pending` and keeps the partial last one.
    fn take_lines(&mut self, window: &Mutex<Window>) {
        if let Some(max) = self.pickle {
            return self.take_messages(max, window);
        }
        if self.skipping {
            match memchr::memchr(b'\n', &self.pending) {
                Some(end) => {
                    self.pending.drain(..=end);
                    self.skipping = false;
                }
                None => return self.pending.clear(),
            }
        }
        let whole = memchr::memrchr(b'\n', &self.pending).map_or(0, |end| end + 1);
        let mut pending = std::mem::take(&mut self.pending);
        if whole > 0 {
            let mut window = window.lock().unwrap_or_else(|p| p.into_inner());
            let body = &pending[..whole];
            if body.len() <= self.max_line_bytes {
                self.handler.handle_lines(body, &mut window);
            } else {
                for line in body.split_inclusive(|&b| b == b'\n') {
                    if line.len() - 1 > self.max_line_bytes {
                        self.too_long(line);
                    } else {
                        self.handler.handle_lines(line, &mut window);
                    }
                }
            }
            drop(window);
            pending.drain(..whole);
        }
        if pending.len() > self.max_line_bytes {
            self.too_long(&pending);
            pending.clear();
            self.skipping = true;
        }
        self.pending = pending;
    }

    fn too_long(&mut self, line: &[u8]) {
        self.handler.tally.lines += 1;
        self.handler.reject(BadLine::LineTooLong, line);
    }

    /// The connection ended: a partial last line is a line (`closed` by the client) or the
    /// cut-off start of one (a stop).
    fn finish(&mut self, closed: bool, window: &Mutex<Window>) {
        if self.skipping || self.pending.is_empty() {
            return;
        }
        let line = std::mem::take(&mut self.pending);
        if closed && self.pickle.is_none() {
            let mut window = window.lock().unwrap_or_else(|p| p.into_inner());
            self.handler.handle_lines(&line, &mut window);
        } else {
            self.handler.tally.lines += 1;
            self.handler.reject(BadLine::Truncated, &line);
        }
    }

    fn publish(&mut self, transport: Transport, settings: &Settings) {
        self.handler.flush_relay();
        settings.telemetry.publish(transport, &self.handler.tally);
        self.handler.tally = Default::default();
        settings.bad_lines.log(&mut self.handler, transport);
    }
}

async fn read_connection<S: AsyncRead + Unpin>(
    mut stream: S,
    transport: Transport,
    settings: &Settings,
    stop: &CancellationToken,
) {
    let mut framer = Framer::new(settings, transport);
    let closed = loop {
        framer.pending.reserve(READ_BYTES);
        let read = tokio::select! {
            _ = stop.cancelled() => break drain(&mut stream, &mut framer, settings).await,
            read = read_some(&mut stream, &mut framer.pending, settings.idle_timeout) => read,
        };
        match read {
            Ok(0) => break true,
            Ok(n) => {
                framer.handler.tally.bytes += n as u64;
                framer.take_lines(&settings.window);
                framer.publish(transport, settings);
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                settings
                    .telemetry
                    .connections(transport)
                    .idle_closed
                    .increment(1);
                break true;
            }
            Err(_) => break true,
        }
    };
    framer.finish(closed, &settings.window);
    framer.publish(transport, settings);
}

/// One read, or `TimedOut` after `idle` without data.
async fn read_some<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    idle: Option<Duration>,
) -> io::Result<usize> {
    match idle {
        Some(idle) => tokio::time::timeout(idle, stream.read_buf(buf))
            .await
            .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into())),
        None => stream.read_buf(buf).await,
    }
}

/// At a stop: what the kernel already holds for this connection, without waiting for more.
/// Returns whether the client had closed it.
async fn drain<S: AsyncRead + Unpin>(
    stream: &mut S,
    framer: &mut Framer,
    settings: &Settings,
) -> bool {
    loop {
        framer.pending.reserve(READ_BYTES);
        // A zero timeout still polls the read once: ready data is taken, none is waited for.
        // Unconstrained: the task's cooperative budget (about 128 reads) must not end it early.
        let read = tokio::task::unconstrained(stream.read_buf(&mut framer.pending));
        match tokio::time::timeout(Duration::ZERO, read).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(n)) => {
                framer.handler.tally.bytes += n as u64;
                framer.take_lines(&settings.window);
            }
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(max_line_bytes: usize) -> Settings {
        Settings {
            window: Default::default(),
            telemetry: Arc::new(Telemetry::new()),
            sanitize_names: true,
            max_series: usize::MAX,
            max_line_bytes,
            max_pickle_bytes: max_line_bytes,
            max_connections: 10,
            idle_timeout: None,
            bad_lines: Default::default(),
            rules: Default::default(),
            relay: None,
        }
    }

    /// Feeds `reads` one after the other, then ends as a client's close would.
    fn frame(reads: &[&[u8]], max_line_bytes: usize) -> (Window, crate::telemetry::Tally) {
        frame_as(Transport::Tcp, reads, max_line_bytes)
    }

    fn frame_as(
        transport: Transport,
        reads: &[&[u8]],
        max_line_bytes: usize,
    ) -> (Window, crate::telemetry::Tally) {
        let s = settings(max_line_bytes);
        let mut framer = Framer::new(&s, transport);
        for read in reads {
            framer.pending.extend_from_slice(read);
            framer.take_lines(&s.window);
        }
        framer.finish(true, &s.window);
        let window = std::mem::take(&mut *s.window.lock().unwrap());
        (window, framer.handler.tally)
    }

    /// A carbon pickle message: its length, then the pickle of `[(path, (1700000000, 1))]`.
    fn pickle_message(path: &str) -> Vec<u8> {
        let mut p = b"\x80\x02](X".to_vec();
        p.extend((path.len() as u32).to_le_bytes());
        p.extend(path.as_bytes());
        p.extend(b"J\x00\xf1SeK\x01\x86\x86e.");
        [(p.len() as u32).to_be_bytes().to_vec(), p].concat()
    }

    #[test]
    fn pickle_messages_split_across_reads_and_one_too_long_skipped() {
        let (a, long, b) = (
            pickle_message("a"),
            pickle_message(&"x".repeat(200)),
            pickle_message("b"),
        );
        let stream = [&a[..], &long, &b, &pickle_message("c")[..10]].concat();
        // Every cut of the stream into two reads.
        for cut in 0..stream.len() {
            let (w, t) = frame_as(
                Transport::CarbonPickle,
                &[&stream[..cut], &stream[cut..]],
                100,
            );
            let paths: Vec<&str> = w.points.keys().map(|s| s.as_str()).collect();
            assert_eq!(w.points.len(), 2, "cut at {cut}: {paths:?}");
            assert!(w.points.contains_key("a") && w.points.contains_key("b"));
            assert_eq!(t.bad[BadLine::PickleTooLarge as usize], 1, "cut at {cut}");
            // The last bytes are a partial message when the client closes.
            assert_eq!(t.bad[BadLine::Truncated as usize], 1, "cut at {cut}");
            assert_eq!(t.lines, 4);
        }
        let (w, t) = frame_as(
            Transport::CarbonPickle,
            &[b"\x00\x00\x00\x02N.\x00\x00\x00\x02]."],
            100,
        );
        assert_eq!(
            t.bad[BadLine::InvalidPickle as usize],
            1,
            "None is not a list"
        );
        assert_eq!(
            (t.lines, w.points.len()),
            (1, 0),
            "an empty list holds no items"
        );
    }

    #[test]
    fn a_line_split_across_reads_is_joined() {
        let (w, t) = frame(&[b"a:1|c\nb:", b"2|c\r", b"\nc:3|c"], 100);
        assert_eq!(w.counters.len(), 3);
        assert_eq!(t.lines, 3);
        assert_eq!(t.bad_lines(), 0);
    }

    #[test]
    fn a_line_past_the_limit_is_dropped_and_the_stream_goes_on() {
        let long = vec![b'x'; 300];
        let (w, t) = frame(&[b"a:1|c\n", &long, &long, b"x:1|c\nb:1|c\n"], 100);
        assert_eq!(w.counters.len(), 2, "the lines either side are kept");
        assert_eq!(t.bad[BadLine::LineTooLong as usize], 1);
        let (w, t) = frame(&[&[&long[..], b":1|c\nb:1|c\n"].concat()], 100);
        assert_eq!(
            (w.counters.len(), t.bad[BadLine::LineTooLong as usize]),
            (1, 1)
        );
        let (w, t) = frame(&[&long], 100);
        assert_eq!(
            (w.counters.len(), t.bad[BadLine::LineTooLong as usize]),
            (0, 1)
        );
    }

    #[test]
    fn a_stop_counts_a_partial_line_as_truncated() {
        let s = settings(100);
        let mut framer = Framer::new(&s, Transport::Tcp);
        framer.pending.extend_from_slice(b"a:1|c\nb:1|c|#t");
        framer.take_lines(&s.window);
        framer.finish(false, &s.window);
        assert_eq!(s.window.lock().unwrap().counters.len(), 1);
        assert_eq!(framer.handler.tally.bad[BadLine::Truncated as usize], 1);
    }
}
