//! The JSON API under `/api/v1/` (docs/reading.md): the reader's queries over HTTP. Unknown series are
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
use crate::aggregate::StatKind;
use crate::store::query::{PercentilesQuery, Span, parse_duration, parse_quantile};
use crate::store::{QueryError, Schedule, StoreError};

/// Largest page of the known-series list and longest slowest/log listing.
const MAX_PAGE: usize = 500;

/// An API error: its status, and the text of its body `{"error": "..."}`.
pub struct ApiError(pub StatusCode, pub String);

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

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> Self {
        let status = match e {
            QueryError::NotFound(_) => StatusCode::NOT_FOUND,
            QueryError::BadArgument(_) => StatusCode::BAD_REQUEST,
            QueryError::Redis(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError(status, e.to_string())
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

fn bad(e: String) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, e)
}

/// The `from` and `until` parameters (Unix seconds, `now`, or a duration back: `-1d`).
fn span(q: &HashMap<String, String>) -> Result<Span, ApiError> {
    let moment = |name: &str| {
        q.get(name)
            .map(|v| v.parse().map_err(|e| bad(format!("`{name}`: {e}"))))
            .transpose()
    };
    Ok(Span {
        from: moment("from")?,
        until: moment("until")?,
    })
}

/// The `type` parameter: AccessTime (the default), Histogram or Distribution.
fn stat_kind(q: &HashMap<String, String>) -> Result<StatKind, ApiError> {
    q.get("type")
        .map_or(Ok(StatKind::Timer), |t| t.parse().map_err(bad))
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
        .route("/api/v1/busiest", get(busiest))
        .route("/api/v1/series", get(series))
        .route("/api/v1/vitals", get(vitals))
}

async fn counter(
    State(s): State<AppState>,
    Path(series): Path<String>,
    Query(q): Params,
) -> ApiResult {
    let precision = positive(&q, "precision", 1)?;
    let span = span(&q)?;
    let mut queries = s.queries().await?;
    let samples = queries.counter(&series, precision, span).await?;
    let arriving_from = queries.arriving_from(Schedule::Counters, precision);
    Ok(Json(
        json!({ "series": series, "precision": precision, "samples": samples, "arriving_from": arriving_from }),
    ))
}

async fn stats(
    State(s): State<AppState>,
    Path(series): Path<String>,
    Query(q): Params,
) -> ApiResult {
    let kind = stat_kind(&q)?;
    let stats = s.queries().await?.stats(&series, kind).await?;
    Ok(Json(
        json!({ "series": series, "type": kind.redis_name(), "stats": stats }),
    ))
}

/// Quantiles from the buckets: `type`, `quantiles` (comma separated, default 0.5,0.9,0.99), and
/// `last` (a duration, with an optional `precision`) or `hour` (`current`, the default, `last`,
/// or `YYYY-MM-DDTHH`).
async fn percentiles(
    State(s): State<AppState>,
    Path(series): Path<String>,
    Query(q): Params,
) -> ApiResult {
    let query = PercentilesQuery {
        kind: stat_kind(&q)?,
        quantiles: q
            .get("quantiles")
            .map_or("0.5,0.9,0.99", String::as_str)
            .split(',')
            .map(parse_quantile)
            .collect::<Result<Vec<f64>, String>>()
            .map_err(bad)?,
        last: q
            .get("last")
            .map(|d| parse_duration(d))
            .transpose()
            .map_err(bad)?,
        hour: q.get("hour").cloned(),
        precision: q
            .get("precision")
            .map(|_| positive(&q, "precision", 1))
            .transpose()?,
        by_slice: param(&q, "by_slice", false)?,
    };
    let view = s.queries().await?.percentiles(&series, &query).await?;
    Ok(Json(json!({
        "series": series,
        "type": query.kind.redis_name(),
        "quantiles": view.quantiles.iter().map(|(q, v)| json!({"q": q, "value": v})).collect::<Vec<_>>(),
        "relative_accuracy": view.relative_accuracy,
        "count": view.count,
        "precision": view.precision,
        "slices": view.slices,
        "by_slice": view.by_slice,
        "arriving_from": view.arriving_from,
    })))
}

/// The slowest timers, each with its full statistics for the hour.
async fn slowest(State(s): State<AppState>, Query(q): Params) -> ApiResult {
    let limit = positive(&q, "limit", 10)?.min(MAX_PAGE as u64) as usize;
    let mut queries = s.queries().await?;
    let mut out = Vec::new();
    for (series, average) in queries.slowest(limit).await? {
        // None when its hour rolled over since the list was read.
        let stats = queries.reader.stats(&series, StatKind::Timer).await?;
        out.push(json!({ "series": series, "average": average, "stats": stats }));
    }
    Ok(Json(json!(out)))
}

async fn log(State(s): State<AppState>, Path(name): Path<String>, Query(q): Params) -> ApiResult {
    let severity = q.get("severity").map_or("info", String::as_str);
    let limit = positive(&q, "limit", 20)?.min(100) as usize;
    let log = s.queries().await?.log(&name, severity, limit).await?;
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
    let precision = positive(&q, "precision", s.config.counter_precisions()[0])?;
    let span = span(&q)?;
    let mut queries = s.queries().await?;
    let value = queries.gauge(&series).await?;
    // A gauge with a value but no slice at this precision (yet) has no samples, not 404.
    let samples = queries.gauge_history(&series, precision, span).await?;
    let arriving_from = queries.arriving_from(Schedule::Values, precision);
    Ok(Json(
        json!({ "series": series, "value": value, "precision": precision, "samples": samples, "arriving_from": arriving_from }),
    ))
}

async fn set(State(s): State<AppState>, Path(series): Path<String>, Query(q): Params) -> ApiResult {
    let precision = positive(&q, "precision", 60)?;
    let span = span(&q)?;
    let mut queries = s.queries().await?;
    let samples = queries.set(&series, precision, span).await?;
    let arriving_from = queries.arriving_from(Schedule::Values, precision);
    Ok(Json(
        json!({ "series": series, "precision": precision, "samples": samples, "arriving_from": arriving_from }),
    ))
}

/// Known series whose name matches `match` (a glob; a plain word matches anywhere), a page at
/// a time, so the list stays usable with tens of thousands of series.
async fn known(State(s): State<AppState>, Query(q): Params) -> ApiResult {
    let page = positive(&q, "page", 1)? as usize;
    let per_page = positive(&q, "per_page", 50)?.min(MAX_PAGE as u64) as usize;
    let gauges = param(&q, "gauges", false)?;
    let pattern = match_pattern(&q);
    let all = s.queries().await?.known(gauges, pattern.as_deref()).await?;
    let series: Vec<_> = all
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    Ok(Json(
        json!({ "total": all.len(), "page": page, "per_page": per_page, "series": series }),
    ))
}

/// The counter that counted most over its last two slices (of a minute or more), of the first
/// thousand by name: what the dashboard opens on. 404 when there is no counter.
async fn busiest(State(s): State<AppState>) -> ApiResult {
    let now = s.clock.unix_now();
    match s.reader().await?.busiest_counter(now).await? {
        Some((series, precision)) => Ok(Json(json!({ "series": series, "precision": precision }))),
        None => Err(ApiError(StatusCode::NOT_FOUND, "no counter yet".into())),
    }
}

/// Series of a type that has no index: `type=timer|histogram|distribution` (statistics this
/// hour, or a block of packed quantile slices at `precision`) or `set` (a slice at
/// `precision`), default 60, whose name matches `match` (as for `known`), found with a bounded
/// `SCAN`: at most 500, `complete` false when there are more (or the scan stopped after
/// 100 000 keys).
async fn series(State(s): State<AppState>, Query(q): Params) -> ApiResult {
    let kind = match q.get("type").map(String::as_str).unwrap_or("timer") {
        "set" | "s" => None,
        other => Some(other.parse().map_err(bad)?),
    };
    let precision = positive(&q, "precision", 60)?;
    let pattern = match_pattern(&q);
    let (names, complete) = s
        .reader()
        .await?
        .series_of(
            kind,
            (
                precision,
                match kind {
                    Some(_) => s.config.retention().packs_quantiles(precision),
                    None => s.config.retention().history(precision).is_some(),
                },
            ),
            pattern.as_deref(),
            MAX_PAGE,
        )
        .await?;
    Ok(Json(json!({ "series": names, "complete": complete })))
}

/// The dashboard's vitals: each the sum of the metric series named (full names, labels and
/// all, or a name whose every labelled series counts), read from the agent's own metrics.
const VITALS: [(&str, &str); 8] = [
    ("lines_received", "lines_received_total"),
    ("bad_lines", "bad_lines_total"),
    ("backlog_windows", "backlog_windows"),
    ("windows_dropped", "windows_dropped_total"),
    ("kernel_drops", "kernel_drops_total"),
    ("flushes_ok", "flushes_total{outcome=\"ok\"}"),
    ("flushes_failed", "flushes_total{outcome=\"error\"}"),
    ("last_flush_unix", "last_flush_timestamp_seconds"),
];

/// The sum of the series of `metric` in a Prometheus text rendering; `None` when there is none
/// (a renamed metric must not read as 0).
pub(crate) fn metric_sum(text: &str, metric: &str) -> Option<f64> {
    let full = format!("statsd_redis_{metric}");
    let mut values = text.lines().filter_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let labelled = !metric.contains('{')
            && series
                .strip_prefix(full.as_str())
                .is_some_and(|rest| rest.starts_with('{'));
        (series == full || labelled).then(|| value.parse::<f64>().ok())?
    });
    let first = values.next()?;
    Some(first + values.sum::<f64>())
}

/// The agent's own vitals, from its metrics.
async fn vitals(State(s): State<AppState>) -> ApiResult {
    let text = s.telemetry.render();
    let mut out = serde_json::Map::new();
    for (name, metric) in VITALS {
        out.insert(name.into(), json!(metric_sum(&text, metric).unwrap_or(0.0)));
    }
    out.insert("now_unix".into(), json!(s.clock.unix_now()));
    // The dashboard's choice of precision for sets, whose slices are at the configured ones.
    out.insert("precisions".into(), json!(s.config.counter_precisions()));
    Ok(Json(Value::Object(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every vital names a metric the agent exports: a renamed metric fails here instead of
    /// reading 0 on the dashboard.
    #[test]
    fn every_vital_reads_an_exported_metric() {
        let telemetry = crate::telemetry::Telemetry::new();
        telemetry.redis_up.set(1.0);
        let text = telemetry.render();
        for (name, metric) in VITALS {
            assert!(
                metric_sum(&text, metric).is_some(),
                "{name}: no {metric} in\n{text}"
            );
        }
        assert_eq!(
            metric_sum(
                "statsd_redis_a{x=\"1\"} 2\nstatsd_redis_a{x=\"2\"} 3\nstatsd_redis_ab 7\n",
                "a"
            ),
            Some(5.0)
        );
        assert_eq!(metric_sum("statsd_redis_ab 7\n", "a"), None);
    }
}
