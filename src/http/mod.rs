//! The agent's HTTP server (axum): `/metrics` (Prometheus text), `/healthz` (the process
//! answers) and `/readyz` (200 only while Redis answers a `PING`).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::telemetry::Telemetry;

/// Readiness must answer quickly even when Redis hangs.
const READY_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct AppState {
    pub telemetry: Arc<Telemetry>,
    pub redis: redis::Client,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
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
    match crate::store::ping(&state.redis, READY_TIMEOUT).await {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("redis unavailable: {e}\n"),
        ),
    }
}
