//! The Graphite API under `/graphite` (docs/reading.md, "Grafana"): what Grafana's Graphite data source
//! asks, answered from the agent's Redis as graphite-web answers it (`src/graphite/`).
//! Parameters come in the query string or, as Grafana posts them, a form body.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, FromRequest, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::api::ApiError;
use super::{AppState, Turn};
use crate::graphite::source::{Node, Source};
use crate::graphite::{self, GraphiteError, attime, expr, functions, tagged};
use crate::store::StoreError;
use crate::store::clock::Clock;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/graphite/render", get(render).post(render))
        .route("/graphite/metrics/find", get(find).post(find))
        .route("/graphite/metrics", get(find).post(find))
        .route("/graphite/metrics/expand", get(expand).post(expand))
        .route(
            "/graphite/tags/autoComplete/tags",
            get(tag_names).post(tag_names),
        )
        .route(
            "/graphite/tags/autoComplete/values",
            get(tag_values).post(tag_values),
        )
        .route(
            "/graphite/tags/findSeries",
            get(find_series).post(find_series),
        )
        .route("/graphite/version", get(version))
        .route("/graphite/metrics/index.json", get(index_json))
        .route("/graphite/functions", get(function_index))
        .route("/graphite/functions/{name}", get(function_one))
        .route("/graphite/events/get_data", get(events))
}

/// The version Grafana reads to know that tags and `seriesByTag` are there (1.1).
pub const VERSION: &str = "1.1.10";

/// The request's parameters, query string and form body together, in order.
struct Params(Vec<(String, String)>);

/// A handler's parameters: the query string's, then a form body's (Grafana posts them).
impl<S: Send + Sync> FromRequest<S> for Params {
    type Rejection = BytesRejection;

    async fn from_request(request: Request, state: &S) -> Result<Params, BytesRejection> {
        let query = request.uri().query().map(str::to_string);
        let body = Bytes::from_request(request, state).await?;
        Ok(Params::of(query, &body))
    }
}

impl Params {
    fn of(query: Option<String>, body: &Bytes) -> Params {
        let mut all: Vec<(String, String)> =
            serde_urlencoded::from_str(query.as_deref().unwrap_or("")).unwrap_or_default();
        all.extend(serde_urlencoded::from_bytes::<Vec<(String, String)>>(body).unwrap_or_default());
        Params(all)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn owned(&self, name: &str) -> Vec<String> {
        self.all(name).into_iter().map(str::to_string).collect()
    }

    /// `now` (pinned, or `clock`'s), then `from` (default `-1d`) and `until` (default `now`),
    /// ordered, as graphite-web reads them.
    fn times(&self, clock: &Clock) -> Result<(i64, i64, i64), GraphiteError> {
        let clock = clock.unix_now() as i64;
        let read = |name: &str, default: &str, now: i64| {
            let text = self.get(name).unwrap_or(default);
            attime::parse(text, now).map_err(|e| {
                GraphiteError::BadRequest(format!("Invalid value {text:?} for param {name}: {e}"))
            })
        };
        let now = read("now", "now", clock)?;
        let from = read("from", "-1d", now)?;
        let until = read("until", "now", now)?;
        let (from, until) = (from.min(until), from.max(until));
        if from == until {
            return Err(GraphiteError::BadRequest("Invalid empty time range".into()));
        }
        Ok((now, from, until))
    }
}

/// graphite-web's error answers: 400 `Invalid parameters (…)`; 503 when Redis does not answer.
fn error(e: GraphiteError) -> Response {
    match e {
        GraphiteError::BadRequest(m) => (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            format!("Invalid parameters ({m})"),
        )
            .into_response(),
        GraphiteError::Redis(e) => ApiError::from(e).into_response(),
    }
}

/// A JSON answer, or its error as graphite-web answers it.
fn json_answer(answer: Result<Value, GraphiteError>) -> Response {
    match answer {
        Ok(v) => json_body(v.to_string()),
        Err(e) => error(e),
    }
}

/// A JSON answer, or its error as the tag API writes them (`{"error": …}`).
fn tag_answer(answer: Result<Value, GraphiteError>) -> Response {
    match answer {
        Ok(v) => json_body(v.to_string()),
        Err(e) => json_error(e),
    }
}

/// The tag API's errors, as JSON.
fn json_error(e: GraphiteError) -> Response {
    match e {
        GraphiteError::BadRequest(m) => ApiError(StatusCode::BAD_REQUEST, m).into_response(),
        other => error(other),
    }
}

async fn source(state: &AppState) -> Result<Source<'_>, StoreError> {
    Ok(Source::new(
        state.reader_connection().await?,
        state.store.keys(),
        &state.config,
        &state.remembered,
    )
    .with_bulk(&state.bulk))
}

fn json_body(text: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}

async fn render(
    State(state): State<AppState>,
    turn: Option<Extension<Turn>>,
    params: Params,
) -> Response {
    match try_render(&state, turn.map(|t| t.0), &params).await {
        Ok(r) => r,
        Err(e) => error(e),
    }
}

async fn try_render(
    state: &AppState,
    turn: Option<Turn>,
    params: &Params,
) -> Result<Response, GraphiteError> {
    let (now, from, until) = params.times(&state.clock)?;
    let targets: Vec<&str> = params
        .all("target")
        .into_iter()
        .filter(|t| !t.trim().is_empty())
        .collect();
    let mut parsed = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        let e = expr::parse(target).map_err(|m| {
            let shown: String = target.chars().take(200).collect();
            let more = if shown.len() < target.len() {
                "…"
            } else {
                ""
            };
            GraphiteError::BadRequest(format!(
                "target {} does not parse: {m}; target: {shown:?}{more}",
                i + 1
            ))
        })?;
        parsed.push(e);
    }
    let max_points = params
        .get("maxDataPoints")
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<usize>().ok());
    if max_points == Some(0) {
        return Err(GraphiteError::BadRequest(
            "maxDataPoints must be at least 1".into(),
        ));
    }
    let format = params.get("format").unwrap_or("json");
    let mut evaluation = graphite::Evaluation::new(source(state).await?, now);
    if format == "json" {
        // Each target in turn, as graphite-web evaluates them: a path under functions that
        // treat each series alone is read a part at a time as the answer is written, any other
        // target evaluated whole now.
        let mut targets = Vec::new();
        for e in &parsed {
            targets.push(match graphite::StreamedTarget::of(e) {
                Some(target) => {
                    let leaves = evaluation.leaves(&target.path).await?;
                    graphite::RenderTarget::Streamed(target, leaves)
                }
                None => graphite::RenderTarget::Whole(evaluation.evaluate(e, from, until).await?),
            });
        }
        let streamed = graphite::Streamed::new(
            &evaluation.source,
            targets,
            (from, until, now),
            max_points,
            params.get("noNullPoints").is_some(),
        )?;
        let first = streamed.first(&mut evaluation.source).await?;
        return Ok(streamed_body(state.clone(), turn, streamed, first));
    }
    let mut data = Vec::new();
    for e in &parsed {
        data.extend(evaluation.evaluate(e, from, until).await?);
    }
    match format {
        "csv" => Ok((
            [(header::CONTENT_TYPE, "text/csv")],
            graphite::render_csv(&data),
        )
            .into_response()),
        other => Err(GraphiteError::BadRequest(format!(
            "format {other:?} is not served: json or csv"
        ))),
    }
}

/// A render in JSON, its answer begun with the first part read ([`graphite::Streamed`]):
/// the body reads and writes the rest as the client takes it, in the connection's own task (a
/// task of its own, woken from the other thread at each part, cost a render more of the
/// agent's CPU than it saved), holding the request's turn until it is done or dropped. Should
/// Redis fail after the answer began, the body ends short of its closing `]` (the connection
/// is cut) and the failure is logged: the status is already sent.
fn streamed_body(
    state: AppState,
    turn: Option<Turn>,
    streamed: graphite::Streamed,
    first: Vec<graphite::series::Series>,
) -> Response {
    use std::task::Poll;
    let queue = Arc::new(std::sync::Mutex::new(VecDeque::<Vec<u8>>::new()));
    let sink = queue.clone();
    let mut producer = Some(Box::pin(async move {
        let _turn = turn;
        let mut source = source(&state).await?;
        let sent = |pieces: Vec<Vec<u8>>| {
            if let Ok(mut q) = sink.lock() {
                q.extend(pieces);
            }
        };
        let written = streamed.write(&mut source, first, sent).await;
        if let Err(e) = &written {
            tracing::warn!(error = %e, "a Graphite render failed after its answer began; its body is cut short");
            if matches!(e, GraphiteError::Redis(_)) {
                state.connection.lock().await.forget();
            }
        }
        written
    }));
    // What was written goes out before a failure ends the body.
    let mut failed = None;
    let body = futures_util::stream::poll_fn(move |cx| {
        loop {
            if let Some(piece) = queue.lock().ok().and_then(|mut q| q.pop_front()) {
                return Poll::Ready(Some(Ok(piece)));
            }
            let Some(p) = producer.as_mut() else {
                return Poll::Ready(failed.take().map(Err));
            };
            // Polled until it waits with nothing written, or is done.
            match p.as_mut().poll(cx) {
                Poll::Ready(written) => {
                    producer = None;
                    failed = written.err().map(|e| std::io::Error::other(e.to_string()));
                }
                Poll::Pending if queue.lock().is_ok_and(|q| q.is_empty()) => return Poll::Pending,
                Poll::Pending => {}
            }
        }
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// `/metrics/find`: the nodes a glob matches at its last level, `treejson` (Grafana's) or
/// `completer`.
async fn find(State(state): State<AppState>, params: Params) -> Response {
    let answer = async {
        let query = params
            .get("query")
            .ok_or_else(|| GraphiteError::BadRequest("Missing required parameter 'query'".into()))?
            .to_string();
        if query.is_empty() {
            return Err(GraphiteError::BadRequest(
                "Required parameter 'query' is empty".into(),
            ));
        }
        if let Some(now) = params.get("now") {
            attime::parse(now, 0).map_err(GraphiteError::BadRequest)?;
        }
        let format = params.get("format").unwrap_or("treejson");
        let base = match query.rsplit_once('.') {
            Some((head, _)) => format!("{head}."),
            None => String::new(),
        };
        let mut query = query.clone();
        if format == "completer" {
            query = query.replace("..", "*.");
            if !query.ends_with('*') {
                query.push('*');
            }
        }
        let nodes = found(&state, &query).await?;
        let entries = entries(&nodes);
        let text = match format {
            "treejson" => {
                let node = |name: &'_ str, leaf: bool| TreeNode {
                    allow_children: u8::from(!leaf),
                    expandable: u8::from(!leaf),
                    id: format!("{base}{name}"),
                    leaf: u8::from(leaf),
                    text: name.to_string(),
                };
                let mut seen = std::collections::HashSet::new();
                let (mut branches, mut leaves) = (Vec::new(), Vec::new());
                // `wildcards=1`: a `*` node first, when there is more than one.
                let wildcard = params.get("wildcards").is_some_and(|w| w != "0") && nodes.len() > 1;
                if wildcard {
                    branches.push(node("*", nodes.iter().all(|n| !n.branch)));
                }
                for (name, _, leaf) in &entries {
                    if !seen.insert(name.as_str()) {
                        continue;
                    }
                    let node = node(name, *leaf);
                    if *leaf {
                        leaves.push(node)
                    } else {
                        branches.push(node)
                    }
                }
                branches.extend(leaves);
                // Strings and numbers only: it cannot fail.
                serde_json::to_string(&branches).unwrap_or_default()
            }
            "completer" => json!({
                "metrics": entries
                    .into_iter()
                    .map(|(name, path, leaf)| json!({
                        "path": if leaf { path } else { format!("{path}.") },
                        "name": name,
                        "is_leaf": if leaf { "1" } else { "0" },
                    }))
                    .collect::<Vec<_>>()
            })
            .to_string(),
            _ => {
                return Err(GraphiteError::BadRequest(
                    "Invalid value for 'format' parameter".into(),
                ));
            }
        };
        Ok(text)
    };
    match answer.await {
        Ok(text) => json_body(text),
        Err(e) => error(e),
    }
}

/// A node of `/metrics/find`'s `treejson` (its keys in the order graphite-web's JSON has them).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct TreeNode {
    allow_children: u8,
    expandable: u8,
    id: String,
    leaf: u8,
    text: String,
}

/// The nodes of a glob, within the limit.
async fn found(state: &AppState, query: &str) -> Result<Vec<Node>, GraphiteError> {
    let nodes = source(state).await?.find(query).await?;
    if nodes.len() > graphite::MAX_SERIES {
        return Err(GraphiteError::BadRequest(format!(
            "the query matches more than {} nodes, the limit: narrow it",
            graphite::MAX_SERIES
        )));
    }
    Ok(nodes)
}

/// A node as graphite-web lists it: a branch and a leaf of one path are two entries, the
/// branch first; sorted by name.
fn entries(nodes: &[Node]) -> Vec<(String, String, bool)> {
    let mut out: Vec<(String, String, bool)> = Vec::new();
    for n in nodes {
        let name = n
            .path
            .rsplit_once('.')
            .map_or(n.path.as_str(), |(_, last)| last);
        if n.branch {
            out.push((name.to_string(), n.path.clone(), false));
        }
        if n.leaf.is_some() {
            out.push((name.to_string(), n.path.clone(), true));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `/metrics/expand`: the paths every `query` matches, sorted (`leavesOnly`, `groupByExpr`).
async fn expand(State(state): State<AppState>, params: Params) -> Response {
    let answer = async {
        let leaves_only = params.get("leavesOnly").is_some_and(|v| v != "0");
        let mut by_query: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for q in params.all("query") {
            let nodes = found(&state, q).await?;
            by_query.entry(q.to_string()).or_default().extend(
                nodes
                    .into_iter()
                    .filter(|n| n.leaf.is_some() || !leaves_only)
                    .map(|n| n.path),
            );
        }
        if params.get("groupByExpr").is_some_and(|v| v != "0") {
            Ok(json!({ "results": by_query }))
        } else {
            let all: std::collections::BTreeSet<String> =
                by_query.into_values().flatten().collect();
            Ok(json!({ "results": all }))
        }
    };
    json_answer(answer.await)
}

/// What `pick` takes of the series' tags (key, value), distinct and sorted, at most `limit`.
fn distinct_tags(
    leaves: &[crate::graphite::source::Leaf],
    limit: usize,
    pick: impl Fn(&str, &str) -> Option<String>,
) -> Value {
    let picked: std::collections::BTreeSet<String> = leaves
        .iter()
        .flat_map(|leaf| graphite::tags_of(&leaf.path).unwrap_or_default())
        .filter_map(|(k, v)| pick(&k, &v))
        .collect();
    json!(picked.into_iter().take(limit).collect::<Vec<_>>())
}

/// The limit of an autocomplete answer (`limit`, 100 by default).
fn limit(params: &Params) -> usize {
    params
        .get("limit")
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// `/tags/autoComplete/tags`: the tag names of the series the `expr`s match (of all series
/// without), less those the expressions name, sorted, starting with `tagPrefix`.
async fn tag_names(State(state): State<AppState>, params: Params) -> Response {
    let answer = async {
        let exprs = params.owned("expr");
        let prefix = params.get("tagPrefix").unwrap_or("");
        let mut source = source(&state).await?;
        let leaves = if exprs.is_empty() {
            source.all_with_prefix("").await?
        } else {
            tagged(&mut source, &exprs).await?
        };
        let named: Vec<String> = exprs
            .iter()
            .filter_map(|e| graphite::TagSpec::parse(e).ok().map(|s| s.tag))
            .collect();
        Ok(distinct_tags(&leaves, limit(&params), |k, _| {
            (k.starts_with(prefix) && !named.iter().any(|n| n == k)).then(|| k.to_string())
        }))
    };
    tag_answer(answer.await)
}

/// `/tags/autoComplete/values`: the values of `tag` among the series the `expr`s match (and
/// that have it), sorted, starting with `valuePrefix`.
async fn tag_values(State(state): State<AppState>, params: Params) -> Response {
    let answer = async {
        let tag = params
            .get("tag")
            .filter(|t| !t.is_empty())
            .ok_or_else(|| GraphiteError::BadRequest("no tag specified".into()))?
            .to_string();
        let mut exprs = params.owned("expr");
        exprs.push(format!("{tag}!="));
        let prefix = params.get("valuePrefix").unwrap_or("");
        let mut source = source(&state).await?;
        let leaves = tagged(&mut source, &exprs).await?;
        Ok(distinct_tags(&leaves, limit(&params), |k, v| {
            (k == tag && v.starts_with(prefix)).then(|| v.to_string())
        }))
    };
    tag_answer(answer.await)
}

/// `/tags/findSeries`: the names of the series the `expr`s match, sorted.
async fn find_series(State(state): State<AppState>, params: Params) -> Response {
    let answer = async {
        let exprs = params.owned("expr");
        let mut source = source(&state).await?;
        let leaves = tagged(&mut source, &exprs).await?;
        Ok(json!(
            leaves.into_iter().map(|l| l.path).collect::<Vec<_>>()
        ))
    };
    tag_answer(answer.await)
}

async fn version() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        format!("{VERSION}\n"),
    )
}

/// `/metrics/index.json`: every dotted series name (leaves), sorted.
async fn index_json(State(state): State<AppState>) -> Response {
    let answer = async {
        let mut source = source(&state).await?;
        let leaves = source.all_with_prefix("").await?;
        Ok::<_, GraphiteError>(json!(
            leaves
                .into_iter()
                .map(|l| l.path)
                .filter(|p| !p.contains(';'))
                .collect::<Vec<_>>()
        ))
    };
    json_answer(answer.await)
}

/// `/functions`: graphite-web's index of every function (`?group=` one group's, `?grouped=1`
/// nested by group).
async fn function_index(params: Params) -> Response {
    let grouped = params
        .get("grouped")
        .is_some_and(|g| g == "1" || g.eq_ignore_ascii_case("true"));
    json_body(functions::index_json(params.get("group"), grouped))
}

/// `/functions/<name>`: one entry of the index; 404 for a function not served.
async fn function_one(axum::extract::Path(name): axum::extract::Path<String>) -> Response {
    match functions::find(&name) {
        Some(f) => json_body(functions::with_infinity(functions::info(&name, f))),
        None => ApiError(
            StatusCode::NOT_FOUND,
            format!("Function \"{name}\" not found"),
        )
        .into_response(),
    }
}

/// `/events/get_data`: the DogStatsD events and service checks the agent logged (`recent:`),
/// as Grafana draws annotations: `[{"when", "what", "data", "tags": [name, severity], "id"}]`
/// between `from` and `until`, oldest first; `tags` (space separated) keeps those with all of
/// them.
async fn events(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params = Params::of(query, &Bytes::new());
    let answer = async {
        let (_, from, until) = params.times(&state.clock)?;
        let wanted: Vec<&str> = params
            .all("tags")
            .into_iter()
            .flat_map(|t| t.split([' ', ',']))
            .filter(|t| !t.is_empty())
            .collect();
        let tags: Vec<String> = wanted.iter().map(|t| t.to_string()).collect();
        let out = source(&state).await?.events(from, until, &tags).await?;
        Ok(json!(
            out.into_iter()
                .enumerate()
                .map(|(i, e)| json!({
                    "when": e.when,
                    "what": e.what,
                    "data": "",
                    "tags": [e.name, e.severity],
                    "id": i + 1,
                }))
                .collect::<Vec<_>>()
        ))
    };
    json_answer(answer.await)
}
