//! The floor receiver for the end-to-end benchmark: reads UDP with `recvmmsg` (64 per call)
//! and counts lines, nothing else. What the agent costs above this is what parsing,
//! aggregating and flushing cost.
//!
//!     cargo run --release --example floor -- 127.0.0.1:8125
//!
//! Exits after 2 s without a datagram (once at least one arrived) and prints
//! `datagrams=<n> lines=<n> cpu_us=<user+system>`.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const BATCH: usize = 64;
const SIZE: usize = 65536;

fn cpu_us() -> u64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8125".into());
    let socket = UdpSocket::bind(&addr).unwrap();
    let sock = socket2::SockRef::from(&socket);
    sock.set_recv_buffer_size(8 << 20).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut data = vec![0u8; BATCH * SIZE];
    let (mut datagrams, mut lines) = (0u64, 0u64);
    let mut last = Instant::now();
    let start_cpu = cpu_us();
    loop {
        let mut iovecs: Vec<libc::iovec> = (0..BATCH)
            .map(|i| libc::iovec {
                iov_base: data[i * SIZE..].as_mut_ptr().cast(),
                iov_len: SIZE,
            })
            .collect();
        // SAFETY: zeroed mmsghdr is empty; each points at a live iovec.
        let mut msgs: Vec<libc::mmsghdr> =
            (0..BATCH).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (m, v) in msgs.iter_mut().zip(iovecs.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: the headers point at live buffers. Blocks up to the socket's read timeout.
        let n = unsafe {
            libc::recvmmsg(
                socket.as_raw_fd(),
                msgs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n <= 0 {
            if datagrams > 0 && last.elapsed() > Duration::from_secs(2) {
                break;
            }
            continue;
        }
        for (i, m) in msgs.iter().take(n as usize).enumerate() {
            let d = &data[i * SIZE..i * SIZE + m.msg_len as usize];
            lines += 1 + d.iter().filter(|b| **b == b'\n').count() as u64;
        }
        datagrams += n as u64;
        last = Instant::now();
    }
    println!(
        "datagrams={datagrams} lines={lines} cpu_us={}",
        cpu_us() - start_cpu
    );
}
