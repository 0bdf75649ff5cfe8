//! A TCP proxy of the test's own between the agent and Redis that delivers late, stalls and
//! cuts: the network faults under which a flush must still be applied exactly once, and a
//! streamed render must not end as if it were whole.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Pass,
    /// Hold the next client write that carries a flush chunk (a transaction, `MULTI` … `EXEC`,
    /// on one server; an `EVALSHA` in a cluster) until
    /// [`FaultProxy::release`], then deliver it to Redis on its original connection, long after
    /// the agent gave up on it.
    HoldNextFlush,
    /// Forward the client's writes, drop the replies from the first to a flush chunk's
    /// transaction on: Redis applies what the agent never hears of.
    SwallowReplies,
    /// Of the next client write that holds these bytes, pass what comes before them and hold
    /// the rest until [`FaultProxy::release`]: Redis answers the commands before them and waits
    /// for the rest of the one they begin, while another client acts in between.
    HoldFrom(&'static [u8]),
    /// Cut the connection of each client write that holds these bytes (what it carried is
    /// lost); pass the others.
    CutWritesWith(&'static [u8]),
    /// Each client write: 1 in 6 cuts the connection (what was read is lost), 1 in 4 stalls for
    /// up to 1.5 s and then arrives, whether the agent still waits or not.
    Chaos,
}

pub struct FaultProxy {
    pub addr: SocketAddr,
    mode: Arc<Mutex<Mode>>,
    release: Arc<Notify>,
    /// Held writes delivered to Redis after their release.
    pub delivered_late: Arc<AtomicUsize>,
    /// The bytes of the last write held.
    pub held: Arc<Mutex<Vec<u8>>>,
    /// Chaos: connections cut and writes stalled.
    pub cuts: Arc<AtomicUsize>,
    pub stalls: Arc<AtomicUsize>,
    /// Chaos: writes stalled now, not yet passed on.
    pub stalled: Arc<AtomicUsize>,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr, seed: u64) -> FaultProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = FaultProxy {
            addr: listener.local_addr().unwrap(),
            mode: Arc::new(Mutex::new(Mode::Pass)),
            release: Arc::new(Notify::new()),
            delivered_late: Arc::default(),
            held: Arc::default(),
            cuts: Arc::default(),
            stalls: Arc::default(),
            stalled: Arc::default(),
        };
        let shared = proxy.shared();
        tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let seed = rng.random();
                tokio::spawn(shared.clone().serve(client, server, seed));
            }
        });
        proxy
    }

    fn shared(&self) -> Shared {
        Shared {
            mode: self.mode.clone(),
            release: self.release.clone(),
            delivered_late: self.delivered_late.clone(),
            held: self.held.clone(),
            cuts: self.cuts.clone(),
            stalls: self.stalls.clone(),
            stalled: self.stalled.clone(),
        }
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Lets a held write go to Redis.
    pub fn release(&self) {
        self.release.notify_one();
    }
}

#[derive(Clone)]
struct Shared {
    mode: Arc<Mutex<Mode>>,
    release: Arc<Notify>,
    delivered_late: Arc<AtomicUsize>,
    held: Arc<Mutex<Vec<u8>>>,
    cuts: Arc<AtomicUsize>,
    stalls: Arc<AtomicUsize>,
    stalled: Arc<AtomicUsize>,
}

impl Shared {
    async fn serve(self, client: TcpStream, server: TcpStream, seed: u64) {
        let (mut cr, mut cw) = client.into_split();
        let (mut sr, mut sw) = server.into_split();
        // Replies go back for as long as Redis sends them; a client that left loses them.
        let mode = self.mode.clone();
        let replies = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 16];
            // The agent checks a chunk's guard before it sends the chunk: those replies pass.
            let mut deaf = false;
            while let Ok(n) = sr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if *mode.lock().unwrap() == Mode::SwallowReplies {
                    deaf = deaf || contains(&buf[..n], b"+QUEUED\r\n");
                    if deaf {
                        continue;
                    }
                }
                let _ = cw.write_all(&buf[..n]).await;
            }
        });
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let data = &buf[..n];
            let mode = *self.mode.lock().unwrap();
            match mode {
                Mode::HoldNextFlush
                    if contains(data, b"EVALSHA") || contains(data, b"\r\nMULTI\r\n") =>
                {
                    *self.mode.lock().unwrap() = Mode::Pass;
                    *self.held.lock().unwrap() = data.to_vec();
                    self.release.notified().await;
                    let _ = sw.write_all(data).await;
                    // Redis must read the copy before it sees the connection end.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    self.delivered_late.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                Mode::HoldFrom(needle) if contains(data, needle) => {
                    *self.mode.lock().unwrap() = Mode::Pass;
                    let at = data
                        .windows(needle.len())
                        .position(|w| w == needle)
                        .unwrap();
                    *self.held.lock().unwrap() = data[at..].to_vec();
                    if sw.write_all(&data[..at]).await.is_err() {
                        break;
                    }
                    self.release.notified().await;
                    if sw.write_all(&data[at..]).await.is_err() {
                        break;
                    }
                    continue;
                }
                Mode::CutWritesWith(needle) if contains(data, needle) => {
                    self.cuts.fetch_add(1, Ordering::SeqCst);
                    replies.abort();
                    return;
                }
                Mode::Chaos => {
                    let roll: f64 = rng.random();
                    if roll < 1.0 / 6.0 {
                        self.cuts.fetch_add(1, Ordering::SeqCst);
                        replies.abort();
                        return;
                    }
                    if roll < 1.0 / 6.0 + 0.25 {
                        self.stalls.fetch_add(1, Ordering::SeqCst);
                        self.stalled.fetch_add(1, Ordering::SeqCst);
                        let stall = rng.random_range(0..1500);
                        tokio::time::sleep(Duration::from_millis(stall)).await;
                        let passed = sw.write_all(data).await;
                        self.stalled.fetch_sub(1, Ordering::SeqCst);
                        if passed.is_err() {
                            break;
                        }
                        continue;
                    }
                }
                _ => {}
            }
            if sw.write_all(data).await.is_err() {
                break;
            }
        }
        // Keep the server side open a little: what was forwarded last is still executed and
        // its reply still read.
        tokio::time::sleep(Duration::from_millis(500)).await;
        replies.abort();
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
