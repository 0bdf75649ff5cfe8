//! A Graphite-compatible read API over the agent's Redis layout, so that Grafana's built-in
//! Graphite data source (URL `http://host:9102/graphite`, version 1.1) charts what the agent
//! stores, with Redis the only store (docs/reading.md, "Grafana"). What a request answers is what
//! graphite-web 1.1.10 answers on the same data (`tests/graphite.rs` runs graphite-web 1.1.10
//! beside the agent and compares).
//!
//! * [`attime`]: `from`, `until`, `now`; [`expr`]: targets; [`functions`]: the render
//!   functions; [`series`]: graphite-web's series and its consolidation; [`names`]: tagged and
//!   dotted names; [`source`]: the layout as Graphite sees it; [`pyfmt`]: numbers as Python
//!   writes them. The HTTP side is `src/http/graphite.rs`.

pub mod attime;
pub mod etsy;
pub mod expr;
pub mod functions;
pub mod names;
pub mod pyfmt;
pub mod series;
pub mod source;

use futures_util::future::BoxFuture;

use expr::{Call, Expr};
use functions::{Body, Ctx, Fetch, State};
use names::parse_tagged;
use series::{Point, Series};
use source::{Leaf, Source};

/// At most this many series a render request reads, and nodes a find answers: past it the
/// request is refused (400, naming the limit), never left to run.
pub const MAX_SERIES: usize = 10_000;

/// At most this many series are matched against a request's tag expressions (a `name=`
/// expression narrows them to that name's range first).
const MAX_TAG_CANDIDATES: usize = 100 * MAX_SERIES;

/// What went wrong: a bad request (400: a target, a time, a function's arguments or what they
/// make of the data; graphite-web answers some of these with a 500), or Redis (503).
#[derive(Debug)]
pub enum GraphiteError {
    BadRequest(String),
    Redis(crate::store::StoreError),
}

impl std::fmt::Display for GraphiteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GraphiteError::BadRequest(m) => f.write_str(m),
            GraphiteError::Redis(e) => e.fmt(f),
        }
    }
}

impl From<crate::store::StoreError> for GraphiteError {
    fn from(e: crate::store::StoreError) -> Self {
        GraphiteError::Redis(e)
    }
}

pub fn bad(message: String) -> GraphiteError {
    GraphiteError::BadRequest(message)
}

/// An evaluated argument of a function.
#[derive(Debug, Clone)]
pub enum Arg {
    Series(Vec<Series>),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    None,
}

impl Arg {
    pub fn number(&self) -> Result<f64, GraphiteError> {
        match self {
            Arg::Int(n) => Ok(*n as f64),
            Arg::Float(f) => Ok(*f),
            Arg::Bool(b) => Ok(f64::from(u8::from(*b))),
            Arg::Str(s) => s
                .parse()
                .map_err(|_| bad(format!("expected a number, got {s:?}"))),
            _ => Err(bad("expected a number".into())),
        }
    }

    /// A node index, when the argument is one.
    pub fn as_index(&self) -> Option<i64> {
        match self {
            Arg::Int(n) => Some(*n),
            Arg::Float(f) if f.fract() == 0.0 => Some(*f as i64),
            _ => None,
        }
    }

    /// The argument as text (a string's text, a number as Python's `str` writes it).
    pub fn text(&self) -> String {
        match self {
            Arg::Str(s) => s.clone(),
            other => other.python_str(),
        }
    }

    /// Python's `str()` of the value.
    pub fn python_str(&self) -> String {
        match self {
            Arg::Str(s) => s.clone(),
            Arg::Int(n) => n.to_string(),
            Arg::Float(f) => pyfmt::repr_string(*f),
            Arg::Bool(b) => if *b { "True" } else { "False" }.into(),
            Arg::None => "None".into(),
            Arg::Series(_) => "[...]".into(),
        }
    }

    /// Python's `repr()` of the value, as an error shows it.
    pub fn python_repr(&self) -> String {
        match self {
            Arg::Str(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
            Arg::Series(s) => format!("[{} series]", s.len()),
            other => other.python_str(),
        }
    }

    pub fn truthy(&self) -> bool {
        match self {
            Arg::Bool(b) => *b,
            Arg::Int(n) => *n != 0,
            Arg::Float(f) => *f != 0.0,
            Arg::Str(s) => !s.is_empty() && !s.eq_ignore_ascii_case("false"),
            _ => false,
        }
    }
}

/// One render request's evaluation: the time range and where series come from.
pub struct Evaluation<'a> {
    pub source: Source<'a>,
    pub now: i64,
    /// Series read so far (against [`MAX_SERIES`]).
    fetched: usize,
    /// What functions leave for the next in the request (graphite-web's request context).
    state: State,
    /// Reading shapes only (series with their times and no values: a `Shaped` function's
    /// first argument).
    shapes_only: bool,
    /// The series each path expression matched, this request.
    found: std::collections::HashMap<String, Vec<Leaf>>,
}

impl<'a> Evaluation<'a> {
    pub fn new(source: Source<'a>, now: i64) -> Evaluation<'a> {
        Evaluation {
            source,
            now,
            fetched: 0,
            state: State::default(),
            shapes_only: false,
            found: Default::default(),
        }
    }

    /// The series of one target between `from` and `until`.
    pub fn evaluate<'e>(
        &'e mut self,
        e: &'e Expr,
        from: i64,
        until: i64,
    ) -> BoxFuture<'e, Result<Vec<Series>, GraphiteError>> {
        Box::pin(async move {
            match e {
                Expr::Path(path) => self.fetch(path, from, until).await,
                Expr::Call(call) => self.call(call, from, until).await,
                _ => Err(bad(
                    "a target is a series, a glob or a function call, not a value".into(),
                )),
            }
        })
    }

    /// The series a path expression matches, in name order, each keeping the expression as
    /// typed as its path expression.
    async fn fetch(
        &mut self,
        path: &str,
        from: i64,
        until: i64,
    ) -> Result<Vec<Series>, GraphiteError> {
        let leaves = self.leaves(path).await?;
        self.read(leaves, path, from, until).await
    }

    /// The series a path expression matches, in name order, counted against [`MAX_SERIES`].
    pub async fn leaves(&mut self, path: &str) -> Result<Vec<Leaf>, GraphiteError> {
        // A path is matched once a request (a function that reads its argument again, a
        // target repeated): the series it names do not depend on the range.
        let leaves = match self.found.get(path) {
            Some(leaves) => leaves.clone(),
            None => {
                let leaves = self.source.leaves(path).await?;
                self.found.insert(path.to_string(), leaves.clone());
                leaves
            }
        };
        self.count(leaves.len())?;
        Ok(leaves)
    }

    /// `n` series more read by this request, against [`MAX_SERIES`].
    fn count(&mut self, n: usize) -> Result<(), GraphiteError> {
        self.fetched += n;
        if self.fetched > MAX_SERIES {
            return Err(bad(format!(
                "the targets match more than {MAX_SERIES} series, the limit of one request: narrow the glob"
            )));
        }
        Ok(())
    }

    async fn read(
        &mut self,
        leaves: Vec<Leaf>,
        path_expression: &str,
        from: i64,
        until: i64,
    ) -> Result<Vec<Series>, GraphiteError> {
        let fetched = if self.shapes_only {
            self.source.shapes(&leaves, from, until, self.now)
        } else {
            self.source
                .fetch_all(&leaves, from, until, self.now)
                .await?
        };
        Ok(fetched
            .into_iter()
            .map(|mut s| {
                s.path_expression = path_expression.to_string();
                s
            })
            .collect())
    }

    async fn call(
        &mut self,
        call: &Call,
        from: i64,
        until: i64,
    ) -> Result<Vec<Series>, GraphiteError> {
        let f = functions::find(&call.name).ok_or_else(|| functions::unknown(&call.name))?;
        if matches!(f.body, Body::Tagged) {
            let specs: Vec<String> = call
                .args
                .iter()
                .map(|a| match a {
                    Expr::Str(s) => Ok(s.clone()),
                    _ => Err(bad("seriesByTag takes tag expressions as strings".into())),
                })
                .collect::<Result<_, _>>()?;
            let leaves = self.tagged(&specs).await?;
            self.count(leaves.len())?;
            return self.read(leaves, &call.raw, from, until).await;
        }
        let mut args = Vec::new();
        for (i, a) in call.args.iter().enumerate() {
            // Only a path's (or a tag query's) series are known without their values; a
            // function's may depend on them (`removeEmptySeries`).
            let read_as_is = match a {
                Expr::Path(_) => true,
                Expr::Call(c) => {
                    functions::find(&c.name).is_some_and(|g| matches!(g.body, Body::Tagged))
                }
                _ => false,
            };
            let shaped = i == 0 && matches!(f.body, Body::Shaped(..)) && read_as_is;
            if shaped {
                // Its shape without its values; should the shape alone fail (an error that
                // depends on the data), it is evaluated whole.
                self.shapes_only = true;
                let shape = self.argument(a, from, until).await;
                self.shapes_only = false;
                if let Ok(shape) = shape {
                    args.push(shape);
                    continue;
                }
            }
            args.push(self.argument(a, from, until).await?);
        }
        let mut kwargs = Vec::new();
        for (k, a) in &call.kwargs {
            kwargs.push((k.clone(), self.argument(a, from, until).await?));
        }
        let mut bound = functions::bind(f, &call.name, args, kwargs)?;
        match f.body {
            Body::Apply(apply) => apply(&mut bound, &mut self.ctx(from, until)),
            Body::Refetch(plan, finish) | Body::Shaped(plan, finish) => {
                let fetches = plan(&bound, &self.ctx(from, until))?;
                let mut fetched = Vec::new();
                for fetch in fetches {
                    fetched.push(self.fetch_for(call, fetch, from, until).await?);
                }
                finish(&mut bound, &mut self.ctx(from, until), fetched)
            }
            Body::Tagged => unreachable!("seriesByTag is read above"),
        }
    }

    fn ctx(&mut self, from: i64, until: i64) -> Ctx<'_> {
        Ctx {
            from,
            until,
            now: self.now,
            state: &mut self.state,
        }
    }

    /// What a function's plan asked to read.
    async fn fetch_for(
        &mut self,
        call: &Call,
        fetch: Fetch,
        from: i64,
        until: i64,
    ) -> Result<Vec<Series>, GraphiteError> {
        match fetch {
            Fetch::First { from, until } => {
                let first = call
                    .args
                    .first()
                    .ok_or_else(|| bad(format!("{}() missing its first argument", call.name)))?;
                self.evaluate(first, from, until).await
            }
            Fetch::Target(target) => {
                let e = expr::parse(&target).map_err(|m| {
                    bad(format!(
                        "{}: the target {target:?} does not parse: {m}",
                        call.name
                    ))
                })?;
                self.evaluate(&e, from, until).await
            }
            Fetch::Events(tags) => {
                let times: Vec<Point> = self
                    .source
                    .events(from, until, &tags)
                    .await?
                    .into_iter()
                    .map(|e| Some(e.when as f64))
                    .collect();
                Ok(vec![Series::new("events", from, until, 1, times)])
            }
        }
    }

    async fn argument(&mut self, a: &Expr, from: i64, until: i64) -> Result<Arg, GraphiteError> {
        match a {
            Expr::Path(_) | Expr::Call(_) => Ok(Arg::Series(self.evaluate(a, from, until).await?)),
            other => literal(other),
        }
    }

    /// The series matching tag expressions, by Graphite name.
    pub async fn tagged(&mut self, specs: &[String]) -> Result<Vec<Leaf>, GraphiteError> {
        tagged(&mut self.source, specs).await
    }
}

/// A value argument of a call.
fn literal(a: &Expr) -> Result<Arg, GraphiteError> {
    Ok(match a {
        Expr::Str(s) => Arg::Str(s.clone()),
        Expr::Int(n) => Arg::Int(*n),
        Expr::Float(f) => Arg::Float(*f),
        Expr::Bool(b) => Arg::Bool(*b),
        Expr::None => Arg::None,
        _ => return Err(bad("expected a value, not a series".into())),
    })
}

/// A tag expression of `seriesByTag`: `tag=value`, `tag!=value`, `tag=~regex`, `tag!=~regex`
/// (a regex anchored at its start, as graphite-web's tag database anchors it).
pub struct TagSpec {
    pub tag: String,
    op: &'static str,
    value: String,
    regex: Option<regex::Regex>,
}

impl TagSpec {
    pub fn parse(spec: &str) -> Result<TagSpec, GraphiteError> {
        let at = spec
            .find(['=', '!'])
            .ok_or_else(|| bad(format!("Invalid tag expression: {spec}")))?;
        let (tag, rest) = spec.split_at(at);
        let op = ["!=~", "=~", "!=", "="]
            .into_iter()
            .find(|op| rest.starts_with(op))
            .ok_or_else(|| bad(format!("Invalid tag expression: {spec}")))?;
        let value = rest[op.len()..].to_string();
        let regex = op
            .ends_with('~')
            .then(|| {
                let anchored = if value.starts_with('^') {
                    value.clone()
                } else {
                    format!("^(?:{value})")
                };
                regex::Regex::new(&anchored)
                    .map_err(|e| bad(format!("bad regular expression in {spec}: {e}")))
            })
            .transpose()?;
        Ok(TagSpec {
            tag: tag.to_string(),
            op,
            value,
            regex,
        })
    }

    pub fn matches(&self, value: &str) -> bool {
        match (self.op, &self.regex) {
            ("=", _) => value == self.value,
            ("!=", _) => value != self.value,
            ("=~", Some(r)) => r.is_match(value),
            ("!=~", Some(r)) => !r.is_match(value),
            _ => false,
        }
    }
}

/// A Graphite name's tags as graphite-web's tag database has them: `None` for a name it does
/// not take (a bare tag), `name` last.
pub fn tags_of(path: &str) -> Option<Vec<(String, String)>> {
    if !path.contains(';') {
        return Some(vec![("name".into(), path.to_string())]);
    }
    parse_tagged(path).map(names::Tagged::into_tags)
}

/// Every series whose tags match all of `specs` (at least one of which must not match the empty
/// string), sorted by Graphite name. A `name=` spec reads only that name's range.
pub async fn tagged(source: &mut Source<'_>, specs: &[String]) -> Result<Vec<Leaf>, GraphiteError> {
    let specs: Vec<TagSpec> = specs
        .iter()
        .map(|s| TagSpec::parse(s))
        .collect::<Result<_, _>>()?;
    if specs.is_empty() {
        return Err(bad("no tag expressions specified".into()));
    }
    if specs.iter().all(|s| s.matches("")) {
        return Err(bad(
            "At least one tagspec must not match the empty string".into()
        ));
    }
    let prefix = specs
        .iter()
        .find(|s| s.tag == "name" && s.op == "=")
        .map_or(String::new(), |s| s.value.clone());
    let candidates = source.all_with_prefix(&prefix).await?;
    if candidates.len() > MAX_TAG_CANDIDATES {
        return Err(bad("too many series to match tags against".into()));
    }
    let mut out: Vec<Leaf> = candidates
        .into_iter()
        .filter(|leaf| {
            let Some(tags) = tags_of(&leaf.path) else {
                return false;
            };
            specs.iter().all(|spec| {
                let value = tags
                    .iter()
                    .find(|(k, _)| *k == spec.tag)
                    .map_or("", |(_, v)| v.as_str());
                spec.matches(value)
            })
        })
        .collect();
    out.sort_by(|a, b| a.path.cmp(&b.path));
    if out.len() > MAX_SERIES {
        return Err(bad(format!(
            "the tag expressions match more than {MAX_SERIES} series, the limit of one request"
        )));
    }
    Ok(out)
}

/// The JSON body of a render of series in hand: `[{"target", "tags", "datapoints":
/// [[value|null, t], …]}]`, with `maxDataPoints` consolidation and `noNullPoints` as
/// graphite-web applies them, one piece a series between the list's opening and closing
/// pieces. A render answers through [`Streamed`], which writes the same a part at a time.
pub fn render_json(data: Vec<Series>, max_points: Option<usize>, no_nulls: bool) -> Vec<Vec<u8>> {
    let bounds: Vec<_> = data
        .iter()
        .map(|s| (s.start, s.end, s.values.len()))
        .collect();
    let mut pieces = vec![JsonWriter::OPEN.to_vec()];
    if let Some(mut writer) = JsonWriter::of_render(&bounds, max_points, no_nulls) {
        pieces.extend(data.into_iter().filter_map(|s| writer.series(s)));
    }
    pieces.push(JsonWriter::CLOSE.to_vec());
    pieces
}

/// A render's series written as graphite-web's JSON one at a time, between [`JsonWriter::OPEN`]
/// and [`JsonWriter::CLOSE`].
pub struct JsonWriter {
    /// `maxDataPoints`, and the time from the earliest series' start to the latest's end.
    fit: Option<(usize, i64)>,
    no_nulls: bool,
    first: bool,
    stamps: Stamps,
}

impl JsonWriter {
    pub const OPEN: &'static [u8] = b"[";
    pub const CLOSE: &'static [u8] = b"]";

    /// The writer of a render whose series span `bounds` (each one's start, end and number of
    /// points), or `None` when none has a point: graphite-web renders nothing then (`if
    /// any(data)`). `maxDataPoints` fits each series to the time from the earliest start to
    /// the latest end.
    pub fn of_render(
        bounds: &[(i64, i64, usize)],
        max_points: Option<usize>,
        no_nulls: bool,
    ) -> Option<JsonWriter> {
        if bounds.iter().all(|b| b.2 == 0) {
            return None;
        }
        let earliest = bounds.iter().map(|b| b.0).min().unwrap_or(0);
        let latest = bounds.iter().map(|b| b.1).max().unwrap_or(0);
        Some(JsonWriter::new(
            max_points.map(|max| (max, latest - earliest)),
            no_nulls,
        ))
    }

    pub fn new(fit: Option<(usize, i64)>, no_nulls: bool) -> JsonWriter {
        JsonWriter {
            fit,
            no_nulls,
            first: true,
            stamps: Stamps::default(),
        }
    }

    /// A series' object, `, ` before it unless it is the first; `None` when `noNullPoints`
    /// leaves it no point.
    pub fn series(&mut self, mut s: Series) -> Option<Vec<u8>> {
        if let Some((max, range)) = self.fit
            && !s.values.is_empty()
        {
            series::fit(&mut s, max, range);
        }
        let text = series_json(&s, self.no_nulls, self.first, &mut self.stamps)?;
        self.first = false;
        Some(text)
    }
}

/// A target a render may stream: a path or glob, inside calls of functions that treat each
/// series alone (`Function::per_series`) whose other arguments are values.
#[derive(Clone, Debug)]
pub struct StreamedTarget {
    pub path: String,
    /// The calls around the path, the innermost first.
    calls: Vec<Call>,
}

impl StreamedTarget {
    /// `e` as a streamed target, or `None` when it must be evaluated whole.
    pub fn of(e: &Expr) -> Option<StreamedTarget> {
        let mut calls = Vec::new();
        let mut e = e;
        loop {
            match e {
                Expr::Path(path) => {
                    calls.reverse();
                    return Some(StreamedTarget {
                        path: path.clone(),
                        calls,
                    });
                }
                Expr::Call(call) => {
                    let (first, rest) = call.args.split_first()?;
                    let values = rest.iter().chain(call.kwargs.iter().map(|(_, a)| a));
                    if !functions::find(&call.name).is_some_and(|f| f.per_series)
                        || values
                            .clone()
                            .any(|a| matches!(a, Expr::Path(_) | Expr::Call(_)))
                    {
                        return None;
                    }
                    calls.push(call.clone());
                    e = first;
                }
                _ => return None,
            }
        }
    }

    /// The calls applied to `list` (series of this target's path), the innermost first.
    fn apply(
        &self,
        mut list: Vec<Series>,
        (from, until, now): (i64, i64, i64),
    ) -> Result<Vec<Series>, GraphiteError> {
        for s in &mut list {
            s.path_expression.clone_from(&self.path);
        }
        for call in &self.calls {
            let f = functions::find(&call.name).ok_or_else(|| functions::unknown(&call.name))?;
            let Body::Apply(apply) = f.body else {
                return Err(bad(format!(
                    "{} is not applied a part at a time",
                    call.name
                )));
            };
            let mut args = vec![Arg::Series(list)];
            for a in &call.args[1..] {
                args.push(literal(a)?);
            }
            let mut kwargs = Vec::new();
            for (k, a) in &call.kwargs {
                kwargs.push((k.clone(), literal(a)?));
            }
            let mut bound = functions::bind(f, &call.name, args, kwargs)?;
            let mut state = State::default();
            list = apply(
                &mut bound,
                &mut Ctx {
                    from,
                    until,
                    now,
                    state: &mut state,
                },
            )?;
        }
        Ok(list)
    }
}

/// The points a streamed render reads at a time ([`Streamed`]).
const PART_POINTS: usize = 16 * 1024;

/// A target of a streamed render: its leaves, read a part at a time, or its series, evaluated
/// whole before the answer begins (any function that is not `per_series`).
pub enum RenderTarget {
    Streamed(StreamedTarget, Vec<Leaf>),
    Whole(Vec<Series>),
}

/// A place in a streamed render's answer: a leaf (and, when it gives a series, [`Source::grid`],
/// the index of its target), or the next series of the targets evaluated whole.
#[derive(Clone, Copy)]
enum Slot {
    Leaf(Option<usize>),
    Whole,
}

/// A part of a streamed render: its slots, and the leaves among them.
struct Part {
    slots: std::ops::Range<usize>,
    leaves: std::ops::Range<usize>,
}

/// A render in JSON: its series read a part at a time (the [`RenderTarget::Streamed`] targets'
/// leaves, put through their functions; the series of the targets evaluated whole in their
/// places) and written as JSON as they come, each part's reading asked of Redis before the
/// part before it is written, so that Redis answers while the agent writes (docs/reading.md,
/// "Renders streamed"). What it writes is what [`render_json`] writes of the same targets
/// evaluated whole.
pub struct Streamed {
    reading: Reading,
    /// The series of the targets evaluated whole, in order.
    whole: Vec<Series>,
    /// About [`PART_POINTS`] points a part.
    parts: Vec<Part>,
    writer: JsonWriter,
}

/// What a streamed render reads its parts with.
struct Reading {
    leaves: Vec<Leaf>,
    targets: Vec<StreamedTarget>,
    /// The answer's places, in order.
    slots: Vec<Slot>,
    /// `from`, `until` and `now`, as [`Source::fetch_all`] takes them.
    times: (i64, i64, i64),
}

impl Streamed {
    /// The render of `targets`. A streamed target's functions are bound and applied to no
    /// series first: an argument they refuse is the request's error, before the answer begins.
    pub fn new(
        source: &Source<'_>,
        targets: Vec<RenderTarget>,
        (from, until, now): (i64, i64, i64),
        max_points: Option<usize>,
        no_nulls: bool,
    ) -> Result<Streamed, GraphiteError> {
        let mut reading = Reading {
            leaves: Vec::new(),
            targets: Vec::new(),
            slots: Vec::new(),
            times: (from, until, now),
        };
        let mut whole = Vec::new();
        // Each slot's start, end and points.
        let mut grids = Vec::new();
        for target in targets {
            match target {
                RenderTarget::Streamed(target, leaves) => {
                    target.apply(Vec::new(), (from, until, now))?;
                    for leaf in leaves {
                        let grid = source.grid(&leaf, from, until, now);
                        let owner = grid.map(|_| reading.targets.len());
                        reading.slots.push(Slot::Leaf(owner));
                        reading.leaves.push(leaf);
                        grids.push(grid);
                    }
                    reading.targets.push(target);
                }
                RenderTarget::Whole(series) => {
                    for s in series {
                        grids.push(Some((s.start, s.end, s.values.len())));
                        reading.slots.push(Slot::Whole);
                        whole.push(s);
                    }
                }
            }
        }
        let mut parts = Vec::new();
        let (mut start, mut leaf, mut points) = (0, 0, 0);
        for (i, g) in grids.iter().enumerate() {
            points += g.map_or(0, |g| g.2);
            if points >= PART_POINTS || i + 1 == grids.len() {
                let leaves = leaf
                    + reading.slots[start..=i]
                        .iter()
                        .filter(|s| matches!(s, Slot::Leaf(_)))
                        .count();
                parts.push(Part {
                    slots: start..i + 1,
                    leaves: leaf..leaves,
                });
                (start, leaf, points) = (i + 1, leaves, 0);
            }
        }
        let bounds: Vec<_> = grids.into_iter().flatten().collect();
        let writer = JsonWriter::of_render(&bounds, max_points, no_nulls);
        if writer.is_none() {
            parts.clear();
        }
        Ok(Streamed {
            reading,
            whole,
            parts,
            writer: writer.unwrap_or_else(|| JsonWriter::new(None, no_nulls)),
        })
    }

    /// The first part's leaves' series (read before the answer starts: a Redis that does not
    /// answer is an error answer, not a cut body).
    pub async fn first(&self, source: &mut Source<'_>) -> Result<Vec<Series>, GraphiteError> {
        match self.parts.first() {
            Some(part) => self.reading.part(source, part).await,
            None => Ok(Vec::new()),
        }
    }

    /// The whole JSON through `send`, a part's pieces at a time, the first part's leaves'
    /// series given: each next part's reading is sent to Redis before the part in hand is
    /// written (`join!` polls it first), so that Redis answers while the agent writes.
    pub async fn write(
        self,
        source: &mut Source<'_>,
        first: Vec<Series>,
        mut send: impl FnMut(Vec<Vec<u8>>),
    ) -> Result<(), GraphiteError> {
        let Streamed {
            reading,
            whole,
            parts,
            mut writer,
        } = self;
        let mut whole = whole.into_iter();
        let mut pieces = vec![JsonWriter::OPEN.to_vec()];
        let mut read = first;
        let mut parts = parts.iter().peekable();
        while let Some(in_hand) = parts.next() {
            // The part's series in the answer's order: its leaves' as read, the whole targets'
            // in their places.
            let mut leaves = std::mem::take(&mut read).into_iter();
            let series: Vec<Series> = reading.slots[in_hand.slots.clone()]
                .iter()
                .filter_map(|slot| match slot {
                    Slot::Leaf(Some(_)) => leaves.next(),
                    Slot::Leaf(None) => None,
                    Slot::Whole => whole.next(),
                })
                .collect();
            let mut text = std::mem::take(&mut pieces);
            let Some(next) = parts.peek() else {
                text.extend(series.into_iter().filter_map(|s| writer.series(s)));
                pieces = text;
                break;
            };
            let (writer, send) = (&mut writer, &mut send);
            let writing = async move {
                text.extend(series.into_iter().filter_map(|s| writer.series(s)));
                send(text);
            };
            let (next, ()) = tokio::join!(reading.part(source, next), writing);
            read = next?;
        }
        pieces.push(JsonWriter::CLOSE.to_vec());
        send(pieces);
        Ok(())
    }
}

impl Reading {
    /// A part's leaves' series, read as [`Source::fetch_all`] reads them, each run of a
    /// target's through its functions.
    async fn part(
        &self,
        source: &mut Source<'_>,
        part: &Part,
    ) -> Result<Vec<Series>, GraphiteError> {
        if part.leaves.is_empty() {
            return Ok(Vec::new());
        }
        let (from, until, now) = self.times;
        let leaves = self.leaves.get(part.leaves.clone()).unwrap_or_default();
        let read = source.fetch_all(leaves, from, until, now).await?;
        let owners = self.slots[part.slots.clone()]
            .iter()
            .filter_map(|slot| match slot {
                Slot::Leaf(owner) => *owner,
                Slot::Whole => None,
            });
        let mut out = Vec::with_capacity(read.len());
        let mut run: Vec<Series> = Vec::new();
        let mut read = owners.zip(read).peekable();
        while let Some((owner, s)) = read.next() {
            run.push(s);
            if read.peek().is_none_or(|(next, _)| *next != owner) {
                out.extend(self.targets[owner].apply(std::mem::take(&mut run), self.times)?);
            }
        }
        Ok(out)
    }
}

/// The text after each value of a grid, `, <timestamp>]`, kept while series share the grid
/// (most of a render's do), each in a slot of its own.
#[derive(Default)]
struct Stamps {
    start: i64,
    step: i64,
    tails: Vec<Tail>,
}

impl Stamps {
    /// The tails of the grid's first `n` points.
    fn tails(&mut self, start: i64, step: i64, n: usize) -> &[Tail] {
        if (start, step) != (self.start, self.step) {
            (self.start, self.step) = (start, step);
            self.tails.clear();
        }
        let mut digits = itoa::Buffer::new();
        while self.tails.len() < n {
            let t = start + self.tails.len() as i64 * step;
            self.tails
                .push(Tail::of(&[b", ", digits.format(t).as_bytes(), b"]"]));
        }
        &self.tails[..n]
    }
}

/// The text after a value, in a fixed 16 bytes: copied whole (a copy of a length known when
/// compiled is a few moves; one of a length known only when run is a call into `memmove`,
/// which was a quarter of a render's JSON), the point's end then put after its length.
struct Tail {
    bytes: [u8; 16],
    len: usize,
}

impl Tail {
    /// The parts one after the other, or as much of them as fits (`len` says how much did
    /// not).
    fn of(parts: &[&[u8]]) -> Tail {
        let mut tail = Tail {
            bytes: [0; 16],
            len: 0,
        };
        for &b in parts.iter().copied().flatten() {
            if let Some(at) = tail.bytes.get_mut(tail.len) {
                *at = b;
            }
            tail.len += 1;
        }
        tail
    }
}

/// The room a point's text is given: `, [`, its value's room, its tail's (a [`Tail`]'s 16 bytes,
/// or written the long way, at most `, -9223372036854775808]`).
const POINT_ROOM: usize = 3 + pyfmt::VALUE_ROOM + 24;

/// One series' object, `, ` before it unless it is the first; `None` when `noNullPoints` leaves
/// it no point.
fn series_json(s: &Series, no_nulls: bool, first: bool, stamps: &mut Stamps) -> Option<Vec<u8>> {
    let (points, step) = s.timed_points();
    let kept = |v: &Point| !no_nulls || v.is_some_and(|v| !v.is_nan());
    if no_nulls && !points.iter().any(kept) {
        return None;
    }
    // One allocation a series: its name, tags and the points' rooms (see below).
    let rooms = POINT_ROOM * points.len() + 2;
    let mut out = Vec::with_capacity(64 + s.name.len() + rooms);
    if !first {
        out.extend_from_slice(b", ");
    }
    let quoted = |text: &str| serde_json::to_string(text).unwrap_or_default().into_bytes();
    out.extend_from_slice(b"{\"target\": ");
    out.extend_from_slice(&quoted(&s.name));
    out.extend_from_slice(b", \"tags\": {");
    for (i, (k, v)) in s.tags.0.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(&quoted(k));
        out.extend_from_slice(b": ");
        out.extend_from_slice(&quoted(v));
    }
    out.extend_from_slice(b"}, \"datapoints\": [");
    // Each point is written into a room of its own, of a size known when compiled (no
    // capacity checked a byte), and the text cut to its end once.
    let mut at = out.len();
    out.resize(at + rooms, 0);
    // What comes before a point's value, `[` for the first and `, [` for the others, copied as
    // three bytes always (a copy of a length known only when run is a call into `memmove`, 5 %
    // of a year's render): the first's two after its `[` are written over by its value.
    let mut open: (&[u8; 3], usize) = (b"[, ", 1);
    let mut scratch = String::new();
    let tails = stamps.tails(s.start, step, points.len());
    for ((i, v), tail) in points.iter().enumerate().zip(tails) {
        if !kept(v) {
            continue;
        }
        let Some(room) = out.get_mut(at..at + POINT_ROOM) else {
            break;
        };
        let room: &mut [u8; POINT_ROOM] = room.try_into().expect("a point's room");
        room[..3].copy_from_slice(open.0);
        let mut len = open.1;
        open = (b", [", 3);
        let value: &mut [u8; pyfmt::VALUE_ROOM] = (&mut room[len..len + pyfmt::VALUE_ROOM])
            .try_into()
            .expect("a value's room");
        len += point_text(*v, value, &mut scratch);
        if tail.len <= tail.bytes.len() {
            room[len..len + 16].copy_from_slice(&tail.bytes);
            len += tail.len;
        } else {
            let t = s.start + i as i64 * step;
            for part in [", ", itoa::Buffer::new().format(t), "]"] {
                room[len..len + part.len()].copy_from_slice(part.as_bytes());
                len += part.len();
            }
        }
        at += len;
    }
    out.truncate(at);
    out.extend_from_slice(b"]}");
    // The rooms left over handed back (in place: a smaller `realloc` splits the block), as a
    // streamed render holds a part's pieces at once.
    out.shrink_to_fit();
    Some(out)
}

/// A point's value as graphite-web's JSON writes it ([`pyfmt::json_number`]; `null` for
/// none), at the start of `room`. Returns its length.
fn point_text(v: Point, room: &mut [u8; pyfmt::VALUE_ROOM], scratch: &mut String) -> usize {
    let Some(v) = v else {
        room[..4].copy_from_slice(b"null");
        return 4;
    };
    if let Some(d) = pyfmt::Decimals::of(v) {
        return d.put(room);
    }
    scratch.clear();
    pyfmt::json_number(v, scratch);
    let len = scratch.len().min(pyfmt::VALUE_ROOM);
    room[..len].copy_from_slice(&scratch.as_bytes()[..len]);
    len
}

/// The CSV body of a render: `name,YYYY-MM-DD HH:MM:SS,value` a point (UTC; a null is empty).
pub fn render_csv(data: &[Series]) -> String {
    let mut out = String::new();
    for s in data {
        let quoted = if s.name.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.name.replace('"', "\"\""))
        } else {
            s.name.clone()
        };
        for (i, v) in s.points().iter().enumerate() {
            // graphite-web times a consolidated point by the series' own step.
            let t = s.start + i as i64 * s.step;
            out.push_str(&quoted);
            out.push(',');
            out.push_str(&crate::store::clock::datetime(t.max(0) as u64));
            out.push(',');
            if let Some(v) = v {
                pyfmt::repr(*v, &mut out);
            }
            out.push_str("\r\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `render_json` writes, the plain way: each value through `pyfmt::json_number`.
    fn plain(data: &[Series], no_nulls: bool) -> String {
        let mut objects = Vec::new();
        for s in data {
            let (points, step) = s.timed_points();
            let mut datapoints = Vec::new();
            for (i, v) in points.iter().enumerate() {
                if no_nulls && !v.is_some_and(|v| !v.is_nan()) {
                    continue;
                }
                let mut value = String::new();
                match v {
                    Some(v) => pyfmt::json_number(*v, &mut value),
                    None => value.push_str("null"),
                }
                datapoints.push(format!("[{value}, {}]", s.start + i as i64 * step));
            }
            if no_nulls && datapoints.is_empty() {
                continue;
            }
            let tags: Vec<String> = s
                .tags
                .0
                .iter()
                .map(|(k, v)| format!("{k:?}: {v:?}"))
                .collect();
            objects.push(format!(
                "{{\"target\": {:?}, \"tags\": {{{}}}, \"datapoints\": [{}]}}",
                s.name,
                tags.join(", "),
                datapoints.join(", ")
            ));
        }
        format!("[{}]", objects.join(", "))
    }

    #[test]
    fn a_render_body_is_each_value_as_python_writes_it() {
        let values = [
            Some(0.0),
            Some(-0.0),
            Some(7.0),
            Some(-12.0),
            Some(1e15),
            Some(-9999999999999998.0),
            Some(1e16),
            Some(2.5),
            Some(1.0 / 3.0),
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(f64::NEG_INFINITY),
            None,
            Some(123456789.0),
            Some(-2.2250738585072014e-308),
            // Few decimals, written into the room as whole numbers are.
            Some(0.5),
            Some(-0.5),
            Some(0.05),
            Some(0.0001),
            Some(-0.0123),
            Some(1234.5678),
            Some(10.05),
            Some(99999999999.5),
            Some(-99999999999.9999),
        ];
        // Whole numbers of each length, and at each edge of one: digits written two at a time;
        // and numbers of a few decimals beside them.
        let edges = (0..16).flat_map(|e| {
            let p = 10f64.powi(e);
            [p - 1.0, p, p + 1.0, -p, -(p - 1.0)].map(Some)
        });
        let edges = edges.chain((0..12).flat_map(|e| {
            let p = 10f64.powi(e);
            [p + 0.5, -(p - 0.25), p - 0.0001, p + 0.001].map(Some)
        }));
        let values: Vec<Point> = values.into_iter().chain(edges).collect();
        let end = 1_760_000_000 + 10 * values.len() as i64;
        let mut a = Series::new("a.b", 1_760_000_000, end, 10, values);
        a.tags.0.push(("name".into(), "a.b".into()));
        // Its grid's times do not fit the tails' slots: written the long way, the longest after
        // the longest value.
        let far = Series::new(
            "far",
            -9_000_000_000_000_000_000,
            -9_000_000_000_000_000_000 + 40,
            10,
            vec![Some(1.0), None, Some(-3.0), Some(-2.2250738585072014e-308)],
        );
        let empty = Series::new("none", 0, 20, 10, vec![None, Some(f64::NAN)]);
        let data = vec![a, far, empty];
        for no_nulls in [false, true] {
            let body: Vec<u8> = render_json(data.clone(), None, no_nulls)
                .into_iter()
                .flatten()
                .collect();
            assert_eq!(
                String::from_utf8(body).expect("text"),
                plain(&data, no_nulls),
                "noNullPoints {no_nulls}"
            );
        }
    }
}
