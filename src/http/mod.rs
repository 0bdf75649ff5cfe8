//! The agent's HTTP server (axum): `/metrics` (Prometheus text), `/healthz` (the process
//! answers), `/readyz` (200 only while Redis answers a `PING`), the JSON API under `/api/v1/`
//! ([`api`]) and the dashboard at `/`.

mod api;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::config::Config;
use crate::store::{Connection, Queries, Reader, Store, StoreError};
use crate::telemetry::Telemetry;

/// Readiness must answer quickly even when Redis hangs.
const READY_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct AppState {
    pub telemetry: Arc<Telemetry>,
    pub store: Store,
    /// The agent's configuration: the precisions, sample count and quantile precisions that
    /// say what the layout holds.
    pub config: Arc<Config>,
    /// One multiplexed connection shared by all API requests, made on first use.
    pub connection: Arc<tokio::sync::Mutex<Option<Connection>>>,
}

impl AppState {
    /// A reader over the shared connection, made when there is none (see [`forget_failed_connection`]).
    async fn reader(&self) -> Result<Reader, StoreError> {
        let mut slot = self.connection.lock().await;
        let conn = match slot.as_ref() {
            Some(c) => c.clone(),
            None => {
                let c = self.store.connect().await?;
                *slot = Some(c.clone());
                c
            }
        };
        Ok(Reader::new(conn, self.store.keys().clone()))
    }

    /// The queries over [`AppState::reader`], with the agent's configuration.
    async fn queries(&self) -> Result<Queries<'_>, StoreError> {
        Ok(Queries {
            reader: self.reader().await?,
            config: &self.config,
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
        *state.connection.lock().await = None;
    }
    response
}

pub fn router(state: AppState) -> Router {
    let api = api::routes().route_layer(middleware::from_fn_with_state(
        state.clone(),
        forget_failed_connection,
    ));
    Router::new()
        .route("/", get(dashboard))
        .merge(api)
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(state)
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

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.telemetry.render(),
    )
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    match state.store.ping(READY_TIMEOUT).await {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("redis unavailable: {e}\n"),
        ),
    }
}
