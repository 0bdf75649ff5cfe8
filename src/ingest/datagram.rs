//! Datagram listeners, UDP and unix: bind with the configured receive buffer, then read
//! datagrams whole, 64 per `recvmmsg`, which also reports truncation (`MSG_TRUNC`) and, for UDP,
//! the kernel's drop counter for the socket (`SO_RXQ_OVFL`; a unix datagram sender waits for
//! room instead of losing the datagram). Each reader is a thread of its own that blocks in
//! `recvmmsg`: one syscall per batch, where an async reader pays a readiness wait and an extra
//! empty read too.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio_util::sync::CancellationToken;

use super::{BadLineLog, LineHandler, SocketFile, Transport};
use crate::aggregate::Window;
use crate::telemetry::Telemetry;

/// How often a reader blocked in `recvmmsg` looks whether it should stop.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// A bound UDP socket and the receive buffer the kernel granted.
#[derive(Debug)]
pub struct BoundUdp {
    pub socket: std::net::UdpSocket,
    pub receive_buffer_bytes: usize,
}

/// Binds `addr` for reading StatsD, asking for `receive_buffer_bytes` of kernel buffer.
/// `shared` sets `SO_REUSEPORT`, so several readers can bind the same port and the kernel
/// spreads senders across them.
pub fn bind(addr: SocketAddr, receive_buffer_bytes: usize, shared: bool) -> io::Result<BoundUdp> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        // `:8125`: every interface of both families, whatever net.ipv6.bindv6only says.
        socket.set_only_v6(false)?;
    }
    if shared {
        socket.set_reuse_port(true)?;
    }
    if receive_buffer_bytes > 0
        && force_recv_buffer(socket.as_raw_fd(), receive_buffer_bytes).is_err()
    {
        // Without CAP_NET_ADMIN the kernel caps this at net.core.rmem_max; the granted size is
        // logged by the caller.
        socket.set_recv_buffer_size(receive_buffer_bytes)?;
    }
    enable_drop_counter(socket.as_raw_fd())?;
    socket.bind(&addr.into())?;
    // Blocking reads that wake up now and then to notice a stop.
    socket.set_read_timeout(Some(STOP_CHECK))?;
    let receive_buffer_bytes = socket.recv_buffer_size()?;
    Ok(BoundUdp {
        socket: socket.into(),
        receive_buffer_bytes,
    })
}

/// Creates the unix datagram socket `path` (a stale one is replaced) with `mode` permissions,
/// asking for `receive_buffer_bytes` of kernel buffer.
pub fn bind_unix(
    path: &Path,
    mode: u32,
    receive_buffer_bytes: usize,
) -> io::Result<(UnixDatagram, SocketFile)> {
    let probe = |p: &Path| UnixDatagram::unbound()?.connect(p);
    let (socket, file) = SocketFile::bind(path, mode, probe, |p| UnixDatagram::bind(p))?;
    if receive_buffer_bytes > 0
        && force_recv_buffer(socket.as_raw_fd(), receive_buffer_bytes).is_err()
    {
        SockRef::from(&socket).set_recv_buffer_size(receive_buffer_bytes)?;
    }
    socket.set_read_timeout(Some(STOP_CHECK))?;
    Ok((socket, file))
}

/// Sets an integer `SOL_SOCKET` option.
fn set_socket_option(fd: RawFd, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid fd and a c_int option value of the right size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `SO_RCVBUFFORCE`: the requested size even above `net.core.rmem_max`, for a process with
/// CAP_NET_ADMIN (bursts are what the buffer is for; the cap is 4 MiB or less on many hosts).
fn force_recv_buffer(fd: RawFd, bytes: usize) -> io::Result<()> {
    let size = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    set_socket_option(fd, libc::SO_RCVBUFFORCE, size)
}

/// `SO_RXQ_OVFL`: the kernel attaches the socket's drop count to received datagrams.
fn enable_drop_counter(fd: RawFd) -> io::Result<()> {
    set_socket_option(fd, libc::SO_RXQ_OVFL, 1)
}

/// Datagrams read per `recvmmsg` call. One call per datagram costs about a microsecond of
/// syscall each; 64 amortise it while a batch's buffers (64 × `max_datagram_bytes`) stay a few MiB.
const BATCH_DATAGRAMS: usize = 64;

/// Room for one SO_RXQ_OVFL control message, u64-aligned as cmsghdr requires.
type Control = [u64; 8];

/// One received datagram of a batch.
#[derive(Debug, Clone, Copy, Default)]
struct Received {
    len: usize,
    truncated: bool,
    /// The socket's cumulative kernel drop count, when the kernel attached it.
    drops: Option<u32>,
}

/// Buffers for one `recvmmsg` call, reused for every batch.
struct Batch {
    data: Vec<u8>,
    size: usize,
    controls: Vec<Control>,
    received: Vec<Received>,
}

impl Batch {
    fn new(max_datagram_bytes: usize) -> Batch {
        Batch {
            data: vec![0; BATCH_DATAGRAMS * max_datagram_bytes],
            size: max_datagram_bytes,
            controls: vec![[0; 8]; BATCH_DATAGRAMS],
            received: vec![Received::default(); BATCH_DATAGRAMS],
        }
    }

    fn datagram(&self, i: usize) -> &[u8] {
        let r = self.received[i];
        &self.data[i * self.size..i * self.size + r.len.min(self.size)]
    }

    /// Reads up to a batch of datagrams; `flags` say whether to wait for the first
    /// (`MSG_WAITFORONE`, up to the socket's read timeout) or not at all (`MSG_DONTWAIT`).
    /// Returns how many arrived.
    fn recv(&mut self, fd: RawFd, flags: libc::c_int) -> io::Result<usize> {
        let mut iovecs: [libc::iovec; BATCH_DATAGRAMS] = std::array::from_fn(|i| libc::iovec {
            iov_base: self.data[i * self.size..].as_mut_ptr().cast(),
            iov_len: self.size,
        });
        // SAFETY: mmsghdr is plain data; all-zero is a valid empty header.
        let mut msgs: [libc::mmsghdr; BATCH_DATAGRAMS] = unsafe { std::mem::zeroed() };
        for (i, m) in msgs.iter_mut().enumerate() {
            m.msg_hdr.msg_iov = &mut iovecs[i];
            m.msg_hdr.msg_iovlen = 1;
            m.msg_hdr.msg_control = self.controls[i].as_mut_ptr().cast();
            m.msg_hdr.msg_controllen = std::mem::size_of::<Control>() as _;
        }
        // SAFETY: every header points at live buffers of the sizes it states.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                BATCH_DATAGRAMS as _,
                flags,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for (m, r) in msgs.iter().zip(self.received.iter_mut()).take(n as usize) {
            let mut drops = None;
            // SAFETY: the CMSG macros walk the control buffer the kernel filled.
            unsafe {
                let mut cmsg = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                while !cmsg.is_null() {
                    if (*cmsg).cmsg_level == libc::SOL_SOCKET
                        && (*cmsg).cmsg_type == libc::SO_RXQ_OVFL
                    {
                        drops = Some(std::ptr::read_unaligned(
                            libc::CMSG_DATA(cmsg).cast::<u32>(),
                        ));
                    }
                    cmsg = libc::CMSG_NXTHDR(&m.msg_hdr, cmsg);
                }
            }
            *r = Received {
                len: m.msg_len as usize,
                truncated: m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                drops,
            };
        }
        Ok(n as usize)
    }
}

/// A reader: one thread per socket, recording into its own window.
pub struct DatagramReader {
    /// A bound datagram socket with a read timeout (UDP or unix).
    pub socket: OwnedFd,
    pub transport: Transport,
    pub window: Arc<Mutex<Window>>,
    pub handler: LineHandler,
    pub telemetry: Arc<Telemetry>,
    pub max_datagram_bytes: usize,
}

impl DatagramReader {
    /// Reads until `stop` is cancelled, then reads what the kernel still holds and returns.
    /// Blocks: run it on a thread of its own.
    pub fn run(mut self, stop: CancellationToken) {
        let mut batch = Batch::new(self.max_datagram_bytes);
        let mut last_drops = 0u32;
        let bad_lines = BadLineLog::default();
        while !stop.is_cancelled() {
            self.read_batch(&mut batch, &mut last_drops, libc::MSG_WAITFORONE);
            self.handler.flush_relay_due();
            bad_lines.log(&mut self.handler, self.transport);
        }
        // Whatever arrived before the stop is still ours to record.
        while self.read_batch(&mut batch, &mut last_drops, libc::MSG_DONTWAIT) > 0 {}
        self.handler.flush_relay();
    }

    /// Reads one batch and records it; returns how many datagrams were read.
    fn read_batch(&mut self, batch: &mut Batch, last_drops: &mut u32, flags: libc::c_int) -> usize {
        let read = loop {
            match batch.recv(self.socket.as_raw_fd(), flags) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // The read timeout, or nothing queued.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return 0;
                }
                Err(e) => {
                    tracing::warn!(transport = self.transport.as_str(), error = %e, "receive failed");
                    std::thread::sleep(STOP_CHECK);
                    return 0;
                }
            }
        };
        {
            let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
            for i in 0..read {
                let r = batch.received[i];
                if let Some(d) = r.drops {
                    self.telemetry
                        .kernel_drops
                        .increment(u64::from(d.wrapping_sub(*last_drops)));
                    *last_drops = d;
                }
                self.handler
                    .handle_datagram(batch.datagram(i), r.truncated, &mut window);
            }
        }
        self.telemetry.publish(self.transport, &self.handler.tally);
        self.handler.tally = Default::default();
        read
    }
}
