//! The relay (`relay`): every line the readers receive goes, as it came, to other StatsD
//! servers, packed into datagrams of at most [`MAX_PACKET`] bytes. Each reader packs its own
//! lines ([`RelayBuffer`]) and hands whole packets to each target's bounded queue without
//! waiting: a full queue (a slow or unreachable target) drops the packet and counts its lines,
//! so the relay never slows ingest. One thread per target sends; a TCP target that goes away is
//! connected again with backoff, the lines meanwhile dropped and counted. A target that is one
//! of the agent's own listeners is refused with the configuration ([`Target::parse_checked`]):
//! each line would come back and go round without end.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, Instant};

use metrics::Counter;

use crate::config::{Config, ConfigError, err, parse_listen};
use crate::telemetry::{LogLimit, Telemetry};

/// The largest datagram the relay sends (a line longer than this goes alone): what fits an
/// Ethernet frame's 1500 bytes with IPv6 and UDP headers to spare, as statsd clients pack.
pub const MAX_PACKET: usize = 1432;

/// Packets queued per target: about 1.4 MiB.
const QUEUE_PACKETS: usize = 1024;

/// How long a datagram reader's packet may wait for more lines before it goes: packing many
/// small datagrams into one costs a target's thread one wake-up per packet instead of one per
/// read, and delays a line by at most this (a stream reader sends at every read).
const LINGER: Duration = Duration::from_millis(10);

/// A TCP target's wait after a failed connect is this doubled per failure (0.2 s first), up
/// to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A send to a TCP target that takes longer than this counts as failed (the target is stalled).
const TCP_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the relay sends: `udp://host:port` or `tcp://host:port`.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub text: String,
    pub tcp: bool,
    pub addr: SocketAddr,
}

impl Target {
    /// Reads the `relay` entries (host names resolved once).
    pub fn parse_all(entries: &[String]) -> Result<Vec<Target>, ConfigError> {
        entries
            .iter()
            .map(|text| {
                let tcp = text.starts_with("tcp://");
                if !tcp && !text.starts_with("udp://") {
                    return Err(err(
                        "relay",
                        format!("`{text}`: a StatsD server is udp://host:port or tcp://host:port"),
                    ));
                }
                let addr = parse_listen(text, if tcp { "tcp" } else { "udp" })
                    .map_err(|e| err("relay", e))?;
                if addr.ip().is_unspecified() {
                    return Err(err("relay", format!("`{text}`: name the host to send to")));
                }
                Ok(Target {
                    text: text.clone(),
                    tcp,
                    addr,
                })
            })
            .collect()
    }

    /// Reads `config`'s `relay` entries and refuses one that reaches one of the agent's own
    /// listeners of its transport (`udp` or `tcp`): what [`Config::validate`] calls, so at
    /// start and at every SIGHUP.
    pub fn parse_checked(config: &Config) -> Result<Vec<Target>, ConfigError> {
        let targets = Target::parse_all(&config.relay)?;
        if targets.is_empty() {
            return Ok(targets);
        }
        let interfaces = interface_addresses();
        let is_local = |ip: IpAddr| ip.is_loopback() || interfaces.contains(&ip);
        for target in &targets {
            let (listeners, transport) = if target.tcp {
                (&config.tcp, "TCP")
            } else {
                (&config.udp, "UDP")
            };
            if let Some(listener) = target.reaches(listeners, is_local) {
                let resolved = if target.text.ends_with(&target.addr.to_string()) {
                    String::new()
                } else {
                    format!(" ({})", target.addr)
                };
                return Err(err(
                    "relay",
                    format!(
                        "`{}`{resolved} reaches this agent's own {transport} listener {listener}: \
                         every line would come back to be counted and relayed again, without end",
                        target.text
                    ),
                ));
            }
        }
        Ok(targets)
    }

    /// The listener among `listeners` (the agent's own, of this target's transport) that the
    /// target's lines would reach, if any: one on the same port bound to the target's address,
    /// or to every address (`0.0.0.0` for IPv4 targets, `[::]` for both families: the agent
    /// binds it dual-stack) when the target's address is this machine's (`is_local`). A
    /// listener on port 0 has its port picked at bind, which no target names.
    fn reaches(
        &self,
        listeners: &[SocketAddr],
        is_local: impl Fn(IpAddr) -> bool,
    ) -> Option<SocketAddr> {
        let ip = self.addr.ip().to_canonical();
        listeners.iter().copied().find(|listener| {
            let bound = listener.ip().to_canonical();
            listener.port() != 0
                && listener.port() == self.addr.port()
                && (bound == ip
                    || (bound == IpAddr::V6(Ipv6Addr::UNSPECIFIED) && is_local(ip))
                    || (bound == IpAddr::V4(Ipv4Addr::UNSPECIFIED) && ip.is_ipv4() && is_local(ip)))
        })
    }
}

/// The addresses of this machine's interfaces (`getifaddrs`), each of which reaches a listener
/// bound to every address; loopback's whole 127.0.0.0/8 is added by the caller. Asking the
/// kernel to bind each target's address would say the same, except under
/// `net.ipv4.ip_nonlocal_bind`, where it would refuse a remote server on the agent's port.
/// None when the list cannot be read: then only loopback targets are caught.
fn interface_addresses() -> Vec<IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list that freeifaddrs releases below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Vec::new();
    }
    let mut addresses = Vec::new();
    let mut cursor = list;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a node of the list getifaddrs returned, not yet freed; its
        // address, when present, is a sockaddr_in or sockaddr_in6 as its family says.
        unsafe {
            let entry = &*cursor;
            if let Some(addr) = entry.ifa_addr.as_ref() {
                match libc::c_int::from(addr.sa_family) {
                    libc::AF_INET => {
                        let v4 = &*entry.ifa_addr.cast::<libc::sockaddr_in>();
                        addresses
                            .push(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))));
                    }
                    libc::AF_INET6 => {
                        let v6 = &*entry.ifa_addr.cast::<libc::sockaddr_in6>();
                        addresses.push(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            cursor = entry.ifa_next;
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    addresses
}

/// A packet: its bytes (lines, each ending in `\n`) and how many lines it holds.
type Packet = (Arc<Vec<u8>>, u64);

/// The targets' queues, shared by the readers.
#[derive(Debug)]
pub struct Relay {
    queues: Vec<Queue>,
}

/// A target's queue, its dropped lines, and whether it takes packets: not while a TCP target
/// is unreachable, so that a dead target costs the readers a flag's load, not a wake-up of its
/// thread per packet.
#[derive(Debug)]
struct Queue {
    sender: SyncSender<Packet>,
    dropped: Counter,
    open: Arc<AtomicBool>,
}

impl Relay {
    /// Starts a sending thread per target.
    pub fn start(targets: &[Target], telemetry: &Telemetry) -> std::io::Result<Arc<Relay>> {
        let mut queues = Vec::new();
        for target in targets {
            let (sender, receiver) = sync_channel(QUEUE_PACKETS);
            let [sent, dropped] = telemetry.relay_lines(&target.text);
            let open = Arc::new(AtomicBool::new(true));
            let sending = Sending {
                target: target.clone(),
                sent,
                dropped: dropped.clone(),
                open: open.clone(),
                log: LogLimit::default(),
            };
            std::thread::Builder::new()
                .name("relay".into())
                .spawn(move || sending.run(receiver))?;
            queues.push(Queue {
                sender,
                dropped,
                open,
            });
        }
        Ok(Arc::new(Relay { queues }))
    }

    /// Whether any target takes packets.
    fn open(&self) -> bool {
        self.queues.iter().any(|q| q.open.load(Ordering::Relaxed))
    }

    /// Counts `lines` as dropped for every target.
    fn drop_lines(&self, lines: u64) {
        for queue in &self.queues {
            queue.dropped.increment(lines);
        }
    }

    /// Queues `packet` for every target, without waiting.
    fn send(&self, packet: Vec<u8>, lines: u64) {
        let packet = Arc::new(packet);
        for queue in &self.queues {
            if !queue.open.load(Ordering::Relaxed) {
                queue.dropped.increment(lines);
                continue;
            }
            match queue.sender.try_send((packet.clone(), lines)) {
                Ok(()) => {}
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                    queue.dropped.increment(lines)
                }
            }
        }
    }
}

/// A reader's packet being filled.
#[derive(Debug)]
pub struct RelayBuffer {
    relay: Arc<Relay>,
    packet: Vec<u8>,
    lines: u64,
    /// When the packet's first line came.
    since: Option<Instant>,
    /// Lines not packed because no target took packets, counted as dropped with the next
    /// flush (a counter's update per batch, not per datagram).
    unsent: u64,
}

impl RelayBuffer {
    pub fn new(relay: Arc<Relay>) -> RelayBuffer {
        RelayBuffer {
            relay,
            packet: Vec::with_capacity(MAX_PACKET),
            lines: 0,
            since: None,
            unsent: 0,
        }
    }

    /// Adds the lines of `body` (empty ones skipped), sending each packet that fills. While
    /// no target takes packets (all unreachable) the lines are only counted as dropped.
    pub fn add(&mut self, body: &[u8]) {
        if !self.relay.open() {
            let lines = body.split(|&b| b == b'\n').filter(|l| !l.is_empty());
            self.unsent += lines.count() as u64;
            return;
        }
        for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            if !self.packet.is_empty() && self.packet.len() + line.len() + 1 > MAX_PACKET {
                self.flush();
            }
            self.packet.extend_from_slice(line);
            self.packet.push(b'\n');
            self.lines += 1;
            self.since.get_or_insert_with(Instant::now);
        }
    }

    /// Sends what the packet holds.
    pub fn flush(&mut self) {
        if self.unsent > 0 {
            self.relay.drop_lines(std::mem::take(&mut self.unsent));
        }
        if self.lines > 0 {
            let packet = std::mem::replace(&mut self.packet, Vec::with_capacity(MAX_PACKET));
            self.relay.send(packet, std::mem::take(&mut self.lines));
            self.since = None;
        }
    }

    /// Sends the packet if its first line has waited [`LINGER`]: a datagram reader asks after
    /// every batch, and at least every 100 ms when nothing comes.
    pub fn flush_due(&mut self) {
        if self.unsent > 0 || self.since.is_some_and(|since| since.elapsed() >= LINGER) {
            self.flush();
        }
    }
}

impl Drop for RelayBuffer {
    fn drop(&mut self) {
        self.flush();
    }
}

/// One target's sending thread.
struct Sending {
    target: Target,
    sent: Counter,
    dropped: Counter,
    open: Arc<AtomicBool>,
    log: LogLimit,
}

impl Sending {
    /// Sends every packet queued until the readers are gone.
    fn run(mut self, queue: Receiver<Packet>) {
        if self.target.tcp {
            self.run_tcp(queue);
        } else {
            self.run_udp(queue);
        }
    }

    fn run_udp(&mut self, queue: Receiver<Packet>) {
        let local: SocketAddr = if self.target.addr.is_ipv6() {
            "[::]:0".parse().unwrap_or(self.target.addr)
        } else {
            "0.0.0.0:0".parse().unwrap_or(self.target.addr)
        };
        let socket = match UdpSocket::bind(local) {
            Ok(socket) => socket,
            Err(e) => {
                tracing::error!(target = %self.target.text, error = %e, "relay: cannot open a UDP socket; nothing is relayed to this target (counted in relay_dropped_total)");
                for (_, lines) in queue {
                    self.dropped.increment(lines);
                }
                return;
            }
        };
        for (packet, lines) in queue {
            match socket.send_to(&packet, self.target.addr) {
                Ok(_) => self.sent.increment(lines),
                Err(e) => self.failed(lines, &e),
            }
        }
    }

    /// Sends over a connection made when the first packet comes. While the target cannot be
    /// reached the queue is closed (the readers count the lines dropped) and connecting is
    /// tried again with backoff; what was queued meanwhile is dropped and counted.
    fn run_tcp(&mut self, queue: Receiver<Packet>) {
        let mut stream: Option<TcpStream> = None;
        let mut backoff = MIN_BACKOFF;
        loop {
            let (packet, lines) = if self.open.load(Ordering::Relaxed) {
                match queue.recv() {
                    Ok(packet) => packet,
                    Err(_) => return,
                }
            } else {
                match queue.recv_timeout(backoff) {
                    Ok((_, lines)) => {
                        self.dropped.increment(lines);
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                    Err(RecvTimeoutError::Timeout) => (Arc::default(), 0),
                }
            };
            if stream.is_none() {
                match TcpStream::connect_timeout(&self.target.addr, TCP_TIMEOUT) {
                    Ok(s) => {
                        let _ = s.set_write_timeout(Some(TCP_TIMEOUT));
                        let _ = s.set_nodelay(true);
                        tracing::info!(target = %self.target.text, "relay: connected");
                        stream = Some(s);
                        backoff = MIN_BACKOFF;
                        self.open.store(true, Ordering::Relaxed);
                    }
                    Err(e) => {
                        self.open.store(false, Ordering::Relaxed);
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        self.failed(lines, &e);
                        continue;
                    }
                }
            }
            let Some(s) = stream.as_mut().filter(|_| lines > 0) else {
                continue;
            };
            match s.write_all(&packet) {
                Ok(()) => self.sent.increment(lines),
                Err(e) => {
                    // What the broken connection took of the packet is unknown: it is counted
                    // as dropped, and the next packet connects again.
                    stream = None;
                    self.failed(lines, &e);
                }
            }
        }
    }

    /// Counts a packet's lines as dropped; logs why at most every 10 s.
    fn failed(&mut self, lines: u64, error: &std::io::Error) {
        self.dropped.increment(lines);
        if let Some(times) = self.log.occurred() {
            tracing::warn!(target = %self.target.text, error = %error, times, "relay: cannot send; the lines are dropped and counted in relay_dropped_total (times: failures since the last such line)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_need_a_scheme_and_a_host() {
        let t = Target::parse_all(&["udp://127.0.0.1:8125".into(), "tcp://[::1]:9".into()]);
        let t = t.unwrap();
        assert!(!t[0].tcp && t[1].tcp);
        for bad in [
            "127.0.0.1:8125",
            "http://x:1",
            "udp://:8125",
            "tcp://127.0.0.1:x",
        ] {
            let e = Target::parse_all(&[bad.into()]).unwrap_err();
            assert_eq!(e.key, "relay", "{bad}");
        }
    }

    /// Whether `relay` reaches one of `listeners` (8125 the port), on a machine whose addresses
    /// are loopback's and 10.1.2.3.
    fn reaches(relay: &str, listeners: &[&str]) -> bool {
        let target = &Target::parse_all(&[relay.into()]).unwrap()[0];
        let listeners: Vec<SocketAddr> = listeners.iter().map(|l| l.parse().unwrap()).collect();
        let local = |ip: IpAddr| ip.is_loopback() || ip == IpAddr::from([10, 1, 2, 3]);
        target.reaches(&listeners, local).is_some()
    }

    #[test]
    fn targets_that_reach_the_agents_own_listeners() {
        for (case, relay, listeners) in [
            (
                "same_address",
                "udp://127.0.0.1:8125",
                &["127.0.0.1:8125"][..],
            ),
            (
                "among_others",
                "udp://127.0.0.1:8125",
                &["127.0.0.1:9", "127.0.0.1:8125"],
            ),
            (
                "wildcard_by_loopback",
                "udp://127.0.0.1:8125",
                &["0.0.0.0:8125"],
            ),
            (
                "wildcard_by_other_loopback",
                "udp://127.0.0.9:8125",
                &["0.0.0.0:8125"],
            ),
            (
                "wildcard_by_interface",
                "udp://10.1.2.3:8125",
                &["0.0.0.0:8125"],
            ),
            ("dual_stack_by_ipv4", "udp://127.0.0.1:8125", &["[::]:8125"]),
            ("dual_stack_by_ipv6", "udp://[::1]:8125", &["[::]:8125"]),
            (
                "dual_stack_by_interface",
                "udp://10.1.2.3:8125",
                &["[::]:8125"],
            ),
            (
                "v4_mapped_target",
                "udp://[::ffff:127.0.0.1]:8125",
                &["127.0.0.1:8125"],
            ),
            (
                "v4_mapped_to_wildcard",
                "udp://[::ffff:10.1.2.3]:8125",
                &["0.0.0.0:8125"],
            ),
            ("same_ipv6_address", "tcp://[::1]:8125", &["[::1]:8125"]),
        ] {
            assert!(reaches(relay, listeners), "{case}");
        }
    }

    #[test]
    fn targets_that_do_not_reach_them() {
        for (case, relay, listeners) in [
            (
                "other_port",
                "udp://127.0.0.1:8126",
                &["127.0.0.1:8125"][..],
            ),
            (
                "remote_host_same_port",
                "udp://192.0.2.7:8125",
                &["0.0.0.0:8125"],
            ),
            (
                "remote_host_dual_stack",
                "udp://[2001:db8::7]:8125",
                &["[::]:8125"],
            ),
            (
                "other_loopback_address",
                "udp://127.0.0.2:8125",
                &["127.0.0.1:8125"],
            ),
            (
                "ipv6_to_ipv4_wildcard",
                "udp://[::1]:8125",
                &["0.0.0.0:8125"],
            ),
            (
                "ipv4_to_ipv6_address",
                "udp://127.0.0.1:8125",
                &["[::1]:8125"],
            ),
            ("port_picked_at_bind", "udp://127.0.0.1:0", &["127.0.0.1:0"]),
            ("no_listener", "udp://127.0.0.1:8125", &[]),
        ] {
            assert!(!reaches(relay, listeners), "{case}");
        }
    }

    /// A UDP relay loops only into UDP listeners, TCP into TCP ones; the line names the key,
    /// the target and the listener.
    #[test]
    fn only_listeners_of_the_targets_transport_are_refused() {
        let config = |relay: &str, udp: &str, tcp: &str| Config {
            relay: vec![relay.into()],
            udp: vec![udp.parse().unwrap()],
            tcp: vec![tcp.parse().unwrap()],
            ..Config::default()
        };
        let e = Target::parse_checked(&config(
            "udp://127.0.0.1:8125",
            "0.0.0.0:8125",
            "127.0.0.1:1",
        ))
        .unwrap_err();
        assert_eq!(e.key, "relay");
        assert!(e.message.contains("`udp://127.0.0.1:8125`"), "{e}");
        assert!(e.message.contains("own UDP listener 0.0.0.0:8125"), "{e}");
        let e = Target::parse_checked(&config("tcp://127.0.0.1:9125", "127.0.0.1:1", "[::]:9125"))
            .unwrap_err();
        assert!(e.message.contains("own TCP listener [::]:9125"), "{e}");
        let udp_to_tcp = config("udp://127.0.0.1:9125", "127.0.0.1:8125", "127.0.0.1:9125");
        assert_eq!(Target::parse_checked(&udp_to_tcp).unwrap().len(), 1);
        let tcp_to_udp = config("tcp://127.0.0.1:8125", "127.0.0.1:8125", "127.0.0.1:9125");
        assert_eq!(Target::parse_checked(&tcp_to_udp).unwrap().len(), 1);
    }

    /// This machine's own interface addresses are read: loopback's at least.
    #[test]
    fn interface_addresses_hold_loopback() {
        assert!(interface_addresses().iter().any(IpAddr::is_loopback));
    }

    /// Lines packed whole into packets of at most MAX_PACKET bytes; a longer line alone.
    #[test]
    fn lines_are_packed_whole() {
        let (sender, receiver) = sync_channel(100);
        let relay = Arc::new(Relay {
            queues: vec![Queue {
                sender,
                dropped: Counter::noop(),
                open: Arc::new(AtomicBool::new(true)),
            }],
        });
        let mut buffer = RelayBuffer::new(relay);
        let line = |i: usize| format!("metric.{i:04}:1|c");
        let body: Vec<String> = (0..200).map(line).collect();
        buffer.add(body.join("\n").as_bytes());
        buffer.add(b"\n\nlong:");
        buffer.add(&[b'x'; 2000]);
        buffer.flush();
        let packets: Vec<Packet> = receiver.try_iter().collect();
        let mut lines = Vec::new();
        for (packet, n) in &packets {
            let text = std::str::from_utf8(packet).unwrap();
            assert!(text.ends_with('\n'));
            let these: Vec<&str> = text.lines().collect();
            assert_eq!(these.len() as u64, *n);
            assert!(
                packet.len() <= MAX_PACKET || these.len() == 1,
                "{}",
                packet.len()
            );
            lines.extend(these.into_iter().map(String::from));
        }
        assert_eq!(lines.len(), 202);
        assert_eq!(lines[..200], body[..]);
        assert_eq!(lines[200], "long:");
        assert_eq!(lines[201].len(), 2000);
    }
}
