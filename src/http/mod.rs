//! The agent's HTTP server: `/metrics` (Prometheus text), `/healthz` (the process answers),
//! `/readyz` (200 while windows are being written), the JSON API under `/api/v1/` ([`api`]) and
//! the dashboard at `/`.
//!
//! [`serve`] runs it on a runtime of its own, so no request can keep the window closer or the
//! writer waiting; each connection must send its request head within [`HEADER_TIMEOUT`], at most
//! [`MAX_CONNECTIONS`] are served at once, and at most [`MAX_API_REQUESTS`] API requests run at
//! once (`/healthz`, `/readyz` and `/metrics` never wait for them).
//!
//! With `web_config_file` ([`web_config`]), connections are TLS ([`tls`]) and requests need a
//! user of the file ([`auth`]), as exporter-toolkit serves them; [`guard`] applies both.

pub(crate) mod api;
pub mod auth;
mod graphite;
pub mod tls;
pub mod web_config;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::store::clock::Clock;
use crate::store::{Cached, Connection, Queries, Reader, Store, StoreError};
use crate::telemetry::{LogLimit, Telemetry};

/// How long a client may take to send a request's head: a connection that sends half a
/// request (or nothing) is closed, not held with its descriptor for ever.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once; further ones wait in the kernel's backlog until one closes.
pub const MAX_CONNECTIONS: usize = 512;

/// API requests that run at once: a query over a large index reads Redis for a while, and a
/// flood of them must not take every thread of the server. Others wait up to
/// [`API_QUEUE_WAIT`], then get 503.
pub const MAX_API_REQUESTS: usize = 4;
const API_QUEUE_WAIT: Duration = Duration::from_secs(5);

/// Threads of the server's own runtime.
const HTTP_THREADS: usize = 2;

#[derive(Clone)]
pub struct AppState {
    pub telemetry: Arc<Telemetry>,
    pub store: Store,
    /// The agent's configuration: the precisions, sample count and quantile precisions that
    /// say what the layout holds.
    pub config: Arc<Config>,
    /// One multiplexed connection shared by all API requests, made on first use; the Graphite
    /// API reads counters' and gauges' points through [`AppState::bulk`] instead (one
    /// connection per request running, pipelined, parsed in place).
    pub connection: Arc<tokio::sync::Mutex<Cached>>,
    /// Permits for API requests ([`MAX_API_REQUESTS`]).
    pub api_permits: Arc<tokio::sync::Semaphore>,
    /// What the Graphite API found by looking around (set and timer names, the indexes' precisions), kept a while.
    pub remembered: Arc<crate::graphite::source::Remembered>,
    /// Where "now" is for `/readyz`, the API and the Graphite API: the agent's clock.
    pub clock: Clock,
    /// Connections that read many counters' and gauges' points at once, for the Graphite API.
    pub bulk: Arc<crate::store::bulk::BulkPool>,
    /// The web configuration file in force: TLS, users, headers.
    pub web: Arc<web_config::Shared>,
    /// With `prometheus_app_metrics`: the applications' series, shown after the agent's own.
    pub app_series: Option<Arc<crate::prometheus::AppSeries>>,
}

impl AppState {
    pub fn new(
        telemetry: Arc<Telemetry>,
        store: Store,
        config: Config,
        clock: Clock,
        web: Arc<web_config::Shared>,
    ) -> AppState {
        AppState {
            clock,
            web,
            telemetry,
            config: Arc::new(config),
            connection: Default::default(),
            api_permits: Arc::new(tokio::sync::Semaphore::new(MAX_API_REQUESTS)),
            remembered: Default::default(),
            bulk: Arc::new(crate::store::bulk::BulkPool::new(
                store.bulk_target(),
                MAX_API_REQUESTS,
            )),
            store,
            app_series: None,
        }
    }

    /// Shows `app_series` on `/metrics`.
    pub fn with_app_series(
        mut self,
        app_series: Option<Arc<crate::prometheus::AppSeries>>,
    ) -> AppState {
        self.app_series = app_series;
        self
    }

    /// The shared connection, made when there is none (see [`forget_failed_connection`]).
    async fn reader_connection(&self) -> Result<Connection, StoreError> {
        Ok(self.connection.lock().await.get(&self.store).await?.0)
    }

    /// A reader over the shared connection.
    async fn reader(&self) -> Result<Reader, StoreError> {
        Ok(Reader::new(
            self.reader_connection().await?,
            self.store.keys().clone(),
        ))
    }

    /// The queries over [`AppState::reader`], with the agent's configuration.
    async fn queries(&self) -> Result<Queries<'_>, StoreError> {
        Ok(Queries {
            reader: self.reader().await?,
            config: &self.config,
            now: self.clock.unix_now(),
        })
    }
}

/// A request that Redis failed (503) drops the shared connection, so the next request connects
/// afresh: a multiplexed connection to a server that restarted stays broken.
async fn forget_failed_connection(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        state.connection.lock().await.forget();
    }
    response
}

/// How long a client may take to send a request's body, and how large it may be: an API request
/// holds one of the [`MAX_API_REQUESTS`] only once its body is in.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Reads an API request's body whole before anything else (and before it may take a turn): a
/// body that does not arrive within [`BODY_TIMEOUT`] is answered 408, one larger than
/// [`MAX_BODY_BYTES`] 413.
async fn read_body_first(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY_BYTES));
    let (status, message) = match read.await {
        Ok(Ok(bytes)) => return next.run(Request::from_parts(parts, bytes.into())).await,
        Ok(Err(_)) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is larger than 2 MiB",
        ),
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive within 10 s",
        ),
    };
    api::ApiError(status, message.into()).into_response()
}

/// An API request's turn among the [`MAX_API_REQUESTS`]: held until the request's work is done,
/// by a streamed render's reading after its answer has begun too.
#[derive(Clone)]
pub struct Turn(#[allow(dead_code)] Arc<tokio::sync::OwnedSemaphorePermit>);

/// At most [`MAX_API_REQUESTS`] API requests at once; one that waits longer than
/// [`API_QUEUE_WAIT`] for its turn is answered 503.
async fn limit_api_requests(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let permit =
        tokio::time::timeout(API_QUEUE_WAIT, state.api_permits.clone().acquire_owned()).await;
    match permit {
        Ok(Ok(permit)) => {
            let mut request = request;
            request.extensions_mut().insert(Turn(Arc::new(permit)));
            next.run(request).await
        }
        _ => api::ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("busy: {MAX_API_REQUESTS} API requests are running; try again"),
        )
        .into_response(),
    }
}

pub fn router(state: AppState) -> Router {
    let api = api::routes()
        .merge(graphite::routes())
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            forget_failed_connection,
        ))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            limit_api_requests,
        ))
        .route_layer(middleware::from_fn(read_body_first));
    Router::new()
        .route("/", get(dashboard))
        .merge(api)
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// The web configuration file's rules, before anything else runs: a request without one of its
/// users is answered 401 (every path; `/healthz` and `/readyz` too unless `web_open_probes`),
/// and every response, the 401 included, carries its headers.
async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(web) = state.web.current() else {
        return next.run(request).await;
    };
    let probe = matches!(request.uri().path(), "/healthz" | "/readyz");
    let mut response = match &web.users {
        Some(users) if !(probe && state.config.web_open_probes) => {
            match users
                .check(request.headers().get(header::AUTHORIZATION))
                .await
            {
                Ok(()) => next.run(request).await,
                Err(failure) => {
                    state.telemetry.http_auth_failures[failure as usize].increment(1);
                    auth::unauthorized(failure)
                }
            }
        }
        _ => next.run(request).await,
    };
    for (name, value) in &web.headers {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    response
}

/// Any other path: a 404 in the API's error form.
async fn not_found(uri: axum::http::Uri) -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        axum::Json(serde_json::json!({ "error": format!("no such path: {}", uri.path()) })),
    )
}

/// The dashboard: one hand-written page that polls the JSON API.
async fn dashboard() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("dashboard.html"),
    )
}

/// The applications' part of `/metrics` is sent in pieces of about this many bytes, each
/// written under the page's lock ([`crate::prometheus::AppSeries::render_some`]).
const PAGE_PIECE: usize = 64 * 1024;

async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.telemetry.render();
    let headers = [(
        header::CONTENT_TYPE,
        "text/plain; version=0.0.4; charset=utf-8",
    )];
    let Some(app) = state.app_series.clone() else {
        return (headers, text).into_response();
    };
    // A family of the agent's own name is left to the agent: two of one name would make the
    // page invalid.
    let own: std::collections::HashSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    // A page of any size is never whole in memory, and holds up the closer for one piece at a
    // time: a page may show two consecutive closes, as a scrape of statsd_exporter's may.
    let start = Some((app, own, crate::prometheus::Cursor::default()));
    let pieces = futures_util::stream::unfold(start, |state| async move {
        let (app, own, mut cursor) = state?;
        let mut piece = String::with_capacity(PAGE_PIECE + 1024);
        let more = app.render_some(&mut cursor, &mut piece, PAGE_PIECE, &|n| own.contains(n));
        let next = more.then_some((app, own, cursor));
        (!piece.is_empty()).then_some((Ok::<_, std::convert::Infallible>(piece), next))
    });
    let first = futures_util::stream::once(std::future::ready(Ok(text)));
    let body = axum::body::Body::from_stream(futures_util::StreamExt::chain(first, pieces));
    (headers, body).into_response()
}

/// Ready while windows are being written: the writer's last attempt reached Redis and was
/// taken, within [`crate::telemetry::Readiness::STALE`], and no window has waited that long.
/// The body also says how many windows a crash would lose, when any would (a full spool disk).
/// From the writer's own state: a request costs Redis nothing.
async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let readiness = &state.telemetry.readiness;
    let (status, mut body) = match readiness.check(state.clock.unix_now()) {
        Ok(()) => (StatusCode::OK, "ready".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}")),
    };
    if let Some(risk) = readiness.at_risk() {
        body = format!("{body}; {risk}");
    }
    (status, body + "\n")
}

/// Serves `app` on `listener` until `shutdown`, on a runtime of its own (its own threads), so
/// that no request delays the window closer or the writer. Returns when every connection has
/// ended (each is asked to finish its request at the stop).
///
/// The accept loop is a task on the runtime's workers, not the thread that waits for it: a
/// connection accepted there is served by the worker that accepted it, where from that thread
/// each accept woke a worker and each readiness the thread (8 context switches a request
/// instead of 3; docs/benchmarks.md, "Small requests: the accept loop on a worker").
pub fn serve(
    listener: std::net::TcpListener,
    app: Router,
    web: Arc<web_config::Shared>,
    telemetry: Arc<Telemetry>,
    shutdown: CancellationToken,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(HTTP_THREADS)
        .thread_name("http")
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            let accepting = runtime.spawn(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => accept(listener, app, web, telemetry, shutdown).await,
                    Err(e) => tracing::error!(error = %e, "HTTP listener unusable"),
                }
            });
            if let Err(e) = runtime.block_on(accepting)
                && e.is_panic()
            {
                std::panic::resume_unwind(e.into_panic());
            }
        })
}

async fn accept(
    listener: tokio::net::TcpListener,
    app: Router,
    web: Arc<web_config::Shared>,
    telemetry: Arc<Telemetry>,
    shutdown: CancellationToken,
) {
    let connections = TaskTracker::new();
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut failed_log = LogLimit::default();
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => permit,
        };
        let Ok(permit) = permit else { break };
        let stream = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match stream {
            Ok((stream, _)) => {
                // As Go's servers do: a TLS flight or an answer's head and body written in
                // several sends must not wait for the client's delayed ACK (40 ms).
                let _ = stream.set_nodelay(true);
                stream
            }
            Err(e) => {
                // Out of descriptors, most likely: wait instead of spinning, log now and then.
                if let Some(times) = failed_log.occurred() {
                    tracing::warn!(error = %e, times, "HTTP accept failed (times: since the last such line)");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let app = app.clone();
        let shutdown = shutdown.clone();
        // TLS or not is the configuration's at the connection's start: a SIGHUP applies to
        // the connections that follow it.
        let tls = web.current().and_then(|w| w.tls.clone());
        let telemetry = telemetry.clone();
        connections.spawn(async move {
            match tls {
                None => serve_connection(stream, false, app, shutdown).await,
                Some(tls) => {
                    // In the connection's task, under the head's timeout: a client that
                    // stalls its handshake holds up no other.
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                    match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                            serve_connection(stream, h2, app, shutdown).await
                        }
                        _ => telemetry.http_tls_handshake_failures.increment(1),
                    }
                }
            }
            drop(permit);
        });
    }
    connections.close();
    connections.wait().await;
}

/// Serves one connection's requests (HTTP/2 when TLS's ALPN chose it) until it ends, it moves
/// no byte for [`IDLE_TIMEOUT`], or, at the stop, until its request in progress is answered.
async fn serve_connection<I>(io: I, h2: bool, app: Router, shutdown: CancellationToken)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let service = hyper_util::service::TowerToHyperService::new(app);
    let activity = Activity::default();
    let io = TokioIo::new(Watched {
        io,
        activity: activity.clone(),
    });
    macro_rules! run {
        ($connection:expr) => {{
            let mut connection = std::pin::pin!($connection);
            let mut check = tokio::time::interval(IDLE_TIMEOUT / 4);
            loop {
                tokio::select! {
                    _ = connection.as_mut() => return,
                    _ = shutdown.cancelled() => break,
                    _ = check.tick() => if activity.idle() > IDLE_TIMEOUT { break },
                }
            }
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(HEADER_TIMEOUT, connection).await;
        }};
    }
    if h2 {
        run!(
            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(MAX_STREAMS)
                .serve_connection(io, service)
        )
    } else {
        run!(
            hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(io, service)
        )
    }
}

/// Requests an HTTP/2 connection may have in flight: a connection is one of the
/// [`MAX_CONNECTIONS`], and its streams must not make it many.
const MAX_STREAMS: u32 = 16;

/// A connection that moves no byte either way for this long is closed. HTTP/1's head timeout
/// already closes an idle one; this is for HTTP/2, which has none, so that idle connections
/// cannot hold the [`MAX_CONNECTIONS`] for ever. Long enough for any request at work (its Redis
/// calls time out far sooner).
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// When a connection last moved a byte, in milliseconds from its start (tokio's clock, which
/// the tests can pause and move).
#[derive(Clone)]
struct Activity {
    started: tokio::time::Instant,
    last_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for Activity {
    fn default() -> Activity {
        Activity {
            started: tokio::time::Instant::now(),
            last_ms: Default::default(),
        }
    }
}

impl Activity {
    fn touch(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_ms
            .store(now, std::sync::atomic::Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let last = self.last_ms.load(std::sync::atomic::Ordering::Relaxed);
        self.started
            .elapsed()
            .saturating_sub(Duration::from_millis(last))
    }
}

/// A connection's stream, noting in [`Activity`] each read and write that moved bytes.
struct Watched<I> {
    io: I,
    activity: Activity,
}

impl<I> Watched<I> {
    /// A write's outcome, noted in [`Activity`] when it moved bytes.
    fn noted(
        &self,
        polled: std::task::Poll<std::io::Result<usize>>,
    ) -> std::task::Poll<std::io::Result<usize>> {
        if matches!(polled, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }
}

impl<I: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<I> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<I: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<I> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write(cx, buf);
        self.noted(polled)
    }

    /// Passed through, so that hyper writes a body's pieces as they are (`writev`) instead of
    /// copying each into a buffer of its own first: a render's JSON once more, a tenth of the
    /// CPU of a year's render.
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.noted(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::Router;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    use super::{IDLE_TIMEOUT, serve_connection};

    /// An HTTP/2 connection (which has no head timeout) that opens and then moves no byte is
    /// closed after [`IDLE_TIMEOUT`], not before: it cannot hold one of the connections for ever.
    #[tokio::test(start_paused = true)]
    async fn an_idle_http2_connection_is_closed_after_the_idle_timeout() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let app = Router::new().route("/", get(|| async { "ok" }));
        let served = tokio::spawn(serve_connection(
            server,
            true,
            app,
            CancellationToken::new(),
        ));
        // The client's preface and an empty SETTINGS frame; then nothing.
        client
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            .await
            .unwrap();
        let (mut read, _write) = tokio::io::split(client);
        let drained = tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = read.read_to_end(&mut sink).await;
        });
        tokio::time::sleep(IDLE_TIMEOUT - Duration::from_secs(10)).await;
        assert!(!served.is_finished(), "closed before the idle timeout");
        tokio::time::timeout(Duration::from_secs(60), served)
            .await
            .expect("still open 50 s past the idle timeout")
            .unwrap();
        drained.abort();
    }
}
