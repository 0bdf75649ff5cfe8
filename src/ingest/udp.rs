//! UDP listeners: bind with the configured receive buffer, then read datagrams whole with
//! `recvmsg`, which also reports truncation (`MSG_TRUNC`) and the kernel's drop counter for the
//! socket (`SO_RXQ_OVFL`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

use super::LineHandler;
use crate::aggregate::Window;
use crate::telemetry::Telemetry;

/// Datagrams read per wake-up before the reader publishes its tally and lets other tasks run.
const BATCH_DATAGRAMS: usize = 64;

/// At most one bad-line log message per reader per this period; the metrics count them all.
const BAD_LINE_LOG_PERIOD: Duration = Duration::from_secs(10);

/// A bound UDP socket and the receive buffer the kernel granted.
#[derive(Debug)]
pub struct BoundUdp {
    pub socket: std::net::UdpSocket,
    pub receive_buffer_bytes: usize,
}

/// Binds `addr` for reading StatsD, asking for `receive_buffer_bytes` of kernel buffer.
pub fn bind(addr: SocketAddr, receive_buffer_bytes: usize) -> io::Result<BoundUdp> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if receive_buffer_bytes > 0 {
        // The kernel caps this at net.core.rmem_max; the granted size is logged by the caller.
        socket.set_recv_buffer_size(receive_buffer_bytes)?;
    }
    enable_drop_counter(socket.as_raw_fd())?;
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    let receive_buffer_bytes = socket.recv_buffer_size()?;
    Ok(BoundUdp {
        socket: socket.into(),
        receive_buffer_bytes,
    })
}

fn enable_drop_counter(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: a valid fd and a c_int option value of the right size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RXQ_OVFL,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One received datagram.
struct Received {
    len: usize,
    truncated: bool,
    /// The socket's cumulative kernel drop count, when the kernel attached it.
    drops: Option<u32>,
}

fn recv_datagram(fd: RawFd, buf: &mut [u8]) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for one SO_RXQ_OVFL control message, u64-aligned as cmsghdr requires.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: msg points at live buffers of the sizes it states.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut drops = None;
    // SAFETY: the CMSG macros walk the control buffer the kernel filled within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SO_RXQ_OVFL {
                drops = Some(std::ptr::read_unaligned(
                    libc::CMSG_DATA(cmsg).cast::<u32>(),
                ));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(Received {
        len: n as usize,
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        drops,
    })
}

/// A reader: one task per socket, recording into its own window.
pub struct Reader {
    pub socket: UdpSocket,
    pub window: Arc<Mutex<Window>>,
    pub handler: LineHandler,
    pub telemetry: Arc<Telemetry>,
    pub max_datagram_bytes: usize,
}

impl Reader {
    /// Reads until `stop` is cancelled, then reads what the kernel still holds and returns.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut buf = vec![0u8; self.max_datagram_bytes];
        let mut last_drops = 0u32;
        let mut last_log = Instant::now() - BAD_LINE_LOG_PERIOD;
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                ready = self.socket.ready(Interest::READABLE) => {
                    if let Err(e) = ready {
                        tracing::error!(error = %e, "UDP socket failed; reader stops");
                        return;
                    }
                }
            }
            while self.read_batch(&mut buf, &mut last_drops, false) == BATCH_DATAGRAMS {
                tokio::task::yield_now().await;
            }
            if self.handler.bad_example.is_some() && last_log.elapsed() >= BAD_LINE_LOG_PERIOD {
                if let Some((reason, line)) = self.handler.bad_example.take() {
                    tracing::warn!(
                        reason = reason.as_str(),
                        line,
                        "bad line (further ones are only counted for the next 10 s)"
                    );
                }
                last_log = Instant::now();
            }
        }
        // Whatever arrived before the stop is still ours to record. Read the socket directly:
        // tokio's readiness may not have seen those datagrams yet.
        while self.read_batch(&mut buf, &mut last_drops, true) > 0 {}
    }

    /// Reads up to a batch of datagrams without waiting; returns how many were read. `direct`
    /// bypasses tokio's readiness tracking (for the final drain only).
    fn read_batch(&mut self, buf: &mut [u8], last_drops: &mut u32, direct: bool) -> usize {
        let fd = self.socket.as_raw_fd();
        let mut read = 0;
        {
            let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
            while read < BATCH_DATAGRAMS {
                let received = if direct {
                    recv_datagram(fd, buf)
                } else {
                    self.socket
                        .try_io(Interest::READABLE, || recv_datagram(fd, buf))
                };
                let received = match received {
                    Ok(r) => r,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "UDP receive failed");
                        break;
                    }
                };
                read += 1;
                if let Some(d) = received.drops {
                    self.telemetry
                        .kernel_drops
                        .increment(u64::from(d.wrapping_sub(*last_drops)));
                    *last_drops = d;
                }
                let len = received.len.min(buf.len());
                self.handler
                    .handle_datagram(&buf[..len], received.truncated, &mut window);
            }
        }
        self.telemetry.publish(&self.handler.tally);
        self.handler.tally = Default::default();
        read
    }
}
