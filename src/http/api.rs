//! The JSON API under `/api/v1/` (SPEC §6): the reader's queries over HTTP. Unknown series are
//! 404, bad parameters 400, an unreachable Redis 503; every error body is `{"error": "..."}`.

use std::collections::HashMap;
use std::str::FromStr;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::AppState;
use crate::cli::{parse_duration, parse_quantile, parse_stat_kind, quantile_range};
use crate::store::StoreError;

/// Largest page of the known-series list and longest slowest/log listing.
const MAX_PAGE: usize = 500;

pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

type Params = Query<HashMap<String, String>>;
type ApiResult = Result<Json<Value>, ApiError>;

fn param<T: FromStr>(q: &HashMap<String, String>, name: &str, default: T) -> Result<T, ApiError> {
    match q.get(name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!("bad value for `{name}`: {v:?}"),
            )
        }),
    }
}

fn positive(q: &HashMap<String, String>, name: &str, default: u64) -> Result<u64, ApiError> {
    match param(q, name, default)? {
        0 => Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("`{name}` must be at least 1"),
        )),
        v => Ok(v),
    }
}

/// The `match` parameter as a glob: a plain word matches anywhere in the name.
fn match_pattern(q: &HashMap<String, String>) -> Option<String> {
    q.get("match").filter(|m| !m.is_empty()).map(|m| {
        if m.contains(['*', '?']) {
            m.clone()
        } else {
            format!("*{m}*")
        }
    })
}

fn not_found(what: String) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, what)
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/counter/{series}", get(counter))
        .route("/api/v1/stats/{series}", get(stats))
        .route("/api/v1/percentiles/{series}", get(percentiles))
        .route("/api/v1/slowest", get(slowest))
        .route("/api/v1/log/{name}", get(log))
        .route("/api/v1/logs", get(logs))
        .route("/api/v1/gauge/{series}", get(gauge))
        .route("/api/v1/set/{series}", get(set))
        .route("/api/v1/known", get(known))
        .route("/api/v1/series", get(series))
        .route("/api/v1/vitals", get(vitals))
}

async fn counter(
    State(s): State<AppState>,
    Path(series): Path<String>,
    Query(q): Params,
) -> ApiResult {
    let precision = positive(&q, "precision", 1)?;
    let samples = s.reader().await?.counter(&series, precision).await?;
    if samples.is_empty() {
        return Err(not_found(format!(
            "no counter `{series}` at precision {precision}"
        )));
    }
    Ok(Json(
        json!({ "series": series, "precision": precision, "samples": samples }),
    ))
}

async fn stats(
    State(s): State<AppState>,
    Path(series): Path<String>,
    Query(q): Params,
) -> ApiResult {
    let kind = parse_stat_kind(q.get("type").map_or("AccessTime", String::as_str))
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?;
    match s.reader().await?.stats(&series, kind).await? {
        Some(stats) => Ok(Json(
            json!({ "series": series, "type": kind.redis_name(), "stats": stats }),
        )),
        None => Err(not_found(format!(
            "no {} statistics for `{series}` this hour",
            kind.redis_name()
        ))),
    }
}

/// Quantiles from the buckets: `type`, `quantiles` (comma separated, default 0.5,0.9,0.99), and
/// `last` (a duration, with an optional `precision`) or `hour` (`current`, the default, `last`,
/// or `YYYY-MM-DDTHH`).
async fn percentiles(
    State(s): State<AppState>,
    Path(series): Path<String>,
    Query(q): Params,
) -> ApiResult {
    let bad = |e: String| ApiError(StatusCode::BAD_REQUEST, e);
    let kind = parse_stat_kind(q.get("type").map_or("AccessTime", String::as_str)).map_err(bad)?;
    let quantiles = q
        .get("quantiles")
        .map_or("0.5,0.9,0.99", String::as_str)
        .split(',')
        .map(parse_quantile)
        .collect::<Result<Vec<f64>, String>>()
        .map_err(bad)?;
    let last = q
        .get("last")
        .map(|d| parse_duration(d))
        .transpose()
        .map_err(bad)?;
    let precision = q
        .get("precision")
        .map(|_| positive(&q, "precision", 1))
        .transpose()?;
    let now = crate::store::clock::unix_now();
    let hour = q.get("hour").map(String::as_str);
    let range = quantile_range(&s.config, last, hour, precision, now).map_err(bad)?;
    let by_slice = param(&q, "by_slice", false)?;
    match s
        .reader()
        .await?
        .quantiles(&series, kind, &quantiles, range, by_slice)
        .await?
    {
        Some(view) => Ok(Json(json!({
            "series": series,
            "type": kind.redis_name(),
            "quantiles": view.quantiles.iter().map(|(q, v)| json!({"q": q, "value": v})).collect::<Vec<_>>(),
            "relative_accuracy": view.relative_accuracy,
            "count": view.count,
            "precision": view.precision,
            "slices": view.slices,
            "by_slice": view.by_slice,
        }))),
        None => Err(not_found(format!(
            "no {} values of `{series}` in that range",
            kind.redis_name()
        ))),
    }
}

/// The slowest timers, each with its full statistics for the hour.
async fn slowest(State(s): State<AppState>, Query(q): Params) -> ApiResult {
    let limit = positive(&q, "limit", 10)?.min(MAX_PAGE as u64) as usize;
    let mut reader = s.reader().await?;
    let mut out = Vec::new();
    for (series, average) in reader.slowest(limit).await? {
        let stats = reader
            .stats(&series, crate::aggregate::StatKind::Timer)
            .await?;
        out.push(json!({ "series": series, "average": average, "stats": stats }));
    }
    Ok(Json(json!(out)))
}

async fn log(State(s): State<AppState>, Path(name): Path<String>, Query(q): Params) -> ApiResult {
    let severity = q.get("severity").map_or("info", String::as_str);
    let limit = positive(&q, "limit", 20)?.min(100) as usize;
    let log = s.reader().await?.log(&name, severity, limit).await?;
    if log.recent.is_empty() && log.common.is_empty() {
        return Err(not_found(format!(
            "no log `{name}` with severity {severity}"
        )));
    }
    Ok(Json(
        json!({ "name": name, "severity": severity, "recent": log.recent, "common": log.common }),
    ))
}

async fn logs(State(s): State<AppState>) -> ApiResult {
    let names = s.reader().await?.log_names(MAX_PAGE).await?;
    Ok(Json(json!(
        names
            .into_iter()
            .map(|(n, sev)| json!({"name": n, "severity": sev}))
            .collect::<Vec<_>>()
    )))
}

async fn gauge(
    State(s): State<AppState>,
    Path(series): Path<String>,
    Query(q): Params,
) -> ApiResult {
    let mut reader = s.reader().await?;
    let Some(value) = reader.gauge(&series).await? else {
        return Err(not_found(format!("no gauge `{series}`")));
    };
    let precision = positive(&q, "precision", s.config.precisions[0])?;
    let samples = reader.gauge_samples(&series, precision).await?;
    Ok(Json(
        json!({ "series": series, "value": value, "precision": precision, "samples": samples }),
    ))
}

async fn set(State(s): State<AppState>, Path(series): Path<String>, Query(q): Params) -> ApiResult {
    let precision = positive(&q, "precision", 60)?;
    let now = crate::store::clock::unix_now();
    let samples = s
        .reader()
        .await?
        .set(&series, precision, now, s.config.sample_count)
        .await?;
    if samples.is_empty() {
        return Err(not_found(format!(
            "no set `{series}` at precision {precision}"
        )));
    }
    Ok(Json(
        json!({ "series": series, "precision": precision, "samples": samples }),
    ))
}

/// Known series whose name matches `match` (a glob; a plain word matches anywhere), a page at
/// a time, so the list stays usable with tens of thousands of series.
async fn known(State(s): State<AppState>, Query(q): Params) -> ApiResult {
    let page = positive(&q, "page", 1)? as usize;
    let per_page = positive(&q, "per_page", 50)?.min(MAX_PAGE as u64) as usize;
    let gauges = param(&q, "gauges", false)?;
    let pattern = match_pattern(&q);
    let all = s.reader().await?.known(gauges, pattern.as_deref()).await?;
    let series: Vec<_> = all
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    Ok(Json(
        json!({ "total": all.len(), "page": page, "per_page": per_page, "series": series }),
    ))
}

/// Series of a type that has no index: `type=timer|histogram|distribution` (statistics this
/// hour) or `set` (a slice at `precision`, default 60) whose name matches `match` (as for
/// `known`), found with a bounded `SCAN`: at most 500, `complete` false when there are more
/// (or the scan stopped after 100 000 keys).
async fn series(State(s): State<AppState>, Query(q): Params) -> ApiResult {
    let kind = match q.get("type").map(String::as_str).unwrap_or("timer") {
        "set" | "s" => None,
        other => Some(parse_stat_kind(other).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?),
    };
    let precision = positive(&q, "precision", 60)?;
    let pattern = match_pattern(&q);
    let (names, complete) = s
        .reader()
        .await?
        .series_of(kind, precision, pattern.as_deref(), MAX_PAGE)
        .await?;
    Ok(Json(json!({ "series": names, "complete": complete })))
}

/// The agent's own vitals, from its metrics.
async fn vitals(State(s): State<AppState>) -> ApiResult {
    let text = s.telemetry.render();
    let value = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(&format!("statsd_redis_{name}")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Ok(Json(json!({
        "lines_received": value("lines_received_total{"),
        "bad_lines": value("bad_lines_total{"),
        "backlog_windows": value("backlog_windows "),
        "windows_dropped": value("windows_dropped_total "),
        "kernel_drops": value("kernel_drops_total "),
        "flushes_ok": value("flushes_total{outcome=\"ok\"}"),
        "flushes_failed": value("flushes_total{outcome=\"error\"}"),
        "last_flush_unix": value("last_flush_timestamp_seconds "),
        "now_unix": crate::store::clock::unix_now(),
    })))
}
