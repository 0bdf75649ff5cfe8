//! The render functions: every name of graphite-web 1.1.10's registry (`render/functions.py`,
//! `SeriesFunctions`), each computing, naming and tagging what graphite-web's computes, names and
//! tags (the answers are compared with graphite-web's own in `tests/graphite.rs`).
//!
//! **A function is declared once**: one [`Function`] carries its name, aliases, group,
//! parameters, description and body. Binding the arguments ([`bind`]), their errors, the
//! `/functions` index ([`info`]) and the unknown function's error all come from the
//! declarations; adding a function is adding one to the file of its group. The files follow
//! graphite-web's groups (the `.group` each function carries there, which `/functions` reports):
//! `combine.rs`, `transform.rs`, `calculate.rs`, `filter.rs` (Filter Series and Filter Data),
//! `sorting.rs`, `alias.rs`, `graph.rs` and `special.rs`. Helpers two groups share live here.

mod alias;
mod calculate;
mod combine;
mod filter;
mod graph;
mod sorting;
mod special;
mod transform;

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::{Value, json};

use super::pyfmt::repr_string;
use super::series::{Point, Series, normalize, rows};
use super::{Arg, GraphiteError, bad};

pub type Result<T> = std::result::Result<T, GraphiteError>;

/// At most this many points a function makes of one series (`time('x', 1)` over ten years,
/// `hitcount`'s buckets, a window of points): past it the request is refused (400, naming the
/// limit), never left to fill the memory. A day at one second is 86 400.
pub const MAX_POINTS: i64 = 1_000_000;

/// At most this many ranges `timeStack` reads (one per shift).
pub const MAX_SHIFTS: i64 = 100;

/// graphite-web's function groups, as `/functions` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    Combine,
    Transform,
    Calculate,
    FilterSeries,
    FilterData,
    Sorting,
    Alias,
    Graph,
    Special,
}

impl Group {
    pub fn name(self) -> &'static str {
        match self {
            Group::Combine => "Combine",
            Group::Transform => "Transform",
            Group::Calculate => "Calculate",
            Group::FilterSeries => "Filter Series",
            Group::FilterData => "Filter Data",
            Group::Sorting => "Sorting",
            Group::Alias => "Alias",
            Group::Graph => "Graph",
            Group::Special => "Special",
        }
    }
}

/// A parameter's type, as graphite-web's `ParamTypes` names it; binding converts a value to it
/// as graphite-web's validators do (`'5'` for a float is 5.0, `'true'` a boolean).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    SeriesList,
    SeriesLists,
    Integer,
    Float,
    Str,
    Boolean,
    Interval,
    IntOrInterval,
    IntOrInf,
    Node,
    NodeOrTag,
    Tag,
    AggFunc,
    AggOrSeriesFunc,
    Any,
    Date,
}

impl Type {
    pub fn name(self) -> &'static str {
        match self {
            Type::SeriesList => "seriesList",
            Type::SeriesLists => "seriesLists",
            Type::Integer => "integer",
            Type::Float => "float",
            Type::Str => "string",
            Type::Boolean => "boolean",
            Type::Interval => "interval",
            Type::IntOrInterval => "intOrInterval",
            Type::IntOrInf => "intOrInf",
            Type::Node => "node",
            Type::NodeOrTag => "nodeOrTag",
            Type::Tag => "tag",
            Type::AggFunc => "aggFunc",
            Type::AggOrSeriesFunc => "aggOrSeriesFunc",
            Type::Any => "any",
            Type::Date => "date",
        }
    }
}

/// A literal of a declaration: a default, an option, a suggestion.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lit {
    Str(&'static str),
    Int(i64),
    Float(f64),
    Bool(bool),
    None,
    Inf,
}

impl Lit {
    fn arg(self) -> Arg {
        match self {
            Lit::Str(s) => Arg::Str(s.into()),
            Lit::Int(n) => Arg::Int(n),
            Lit::Float(f) => Arg::Float(f),
            Lit::Bool(b) => Arg::Bool(b),
            Lit::None => Arg::None,
            Lit::Inf => Arg::Float(f64::INFINITY),
        }
    }

    /// As JSON; infinity as the marker [`INF_MARK`] that [`index_json`] writes as `1e9999`.
    fn json(self) -> Value {
        match self {
            Lit::Str(s) => json!(s),
            Lit::Int(n) => json!(n),
            Lit::Float(f) => json!(f),
            Lit::Bool(b) => json!(b),
            Lit::None => Value::Null,
            Lit::Inf => json!(INF_MARK),
        }
    }

    /// Python's `str()` of it, graphite-web's sort key for options.
    fn python_str(self) -> String {
        self.arg().python_str()
    }
}

const INF_MARK: &str = "<graphite infinity>";

/// One parameter of a function.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    pub name: &'static str,
    pub ty: Type,
    pub required: bool,
    /// Takes every argument from here on (the last parameter only).
    pub multiple: bool,
    pub default: Option<Lit>,
    pub options: &'static [Lit],
    pub suggestions: &'static [Lit],
}

impl Param {
    pub const fn new(name: &'static str, ty: Type) -> Param {
        Param {
            name,
            ty,
            required: false,
            multiple: false,
            default: None,
            options: &[],
            suggestions: &[],
        }
    }
    pub const fn required(self) -> Param {
        Param {
            required: true,
            ..self
        }
    }
    pub const fn multiple(self) -> Param {
        Param {
            multiple: true,
            ..self
        }
    }
    pub const fn default(self, default: Lit) -> Param {
        Param {
            default: Some(default),
            ..self
        }
    }
    pub const fn options(self, options: &'static [Lit]) -> Param {
        Param { options, ..self }
    }
    pub const fn suggest(self, suggestions: &'static [Lit]) -> Param {
        Param {
            suggestions,
            ..self
        }
    }
}

/// The first parameter of most functions.
pub const SERIES: Param = Param::new("seriesList", Type::SeriesList).required();
/// `*seriesLists` of the functions that combine any number of lists.
pub const LISTS: Param = Param::new("seriesLists", Type::SeriesList)
    .required()
    .multiple();
/// `windowSize`'s suggestions (graphite-web's `intOrIntervalSuggestions`).
pub const WINDOWS: &[Lit] = &[
    Lit::Int(5),
    Lit::Int(7),
    Lit::Int(10),
    Lit::Str("1min"),
    Lit::Str("5min"),
    Lit::Str("10min"),
    Lit::Str("30min"),
    Lit::Str("1hour"),
];

/// Computes from the evaluated, bound arguments.
pub type Apply = fn(&mut Args, &mut Ctx) -> Result<Vec<Series>>;
/// Says what else must be read before the function can compute (graphite-web's functions that
/// call `evaluateTarget` again: a window before the range, a shifted range, new targets).
pub type Plan = fn(&Args, &Ctx) -> Result<Vec<Fetch>>;
/// Computes from the arguments and what the plan read, in the plan's order.
pub type Finish = fn(&mut Args, &mut Ctx, Vec<Vec<Series>>) -> Result<Vec<Series>>;

/// What a function does.
#[derive(Clone, Copy)]
pub enum Body {
    Apply(Apply),
    Refetch(Plan, Finish),
    /// As `Refetch`, for a function that reads its first argument again over another range
    /// and uses its evaluation at the request's range only for its shape (names, steps,
    /// times): that evaluation reads no values (graphite-web reads them, for nothing).
    Shaped(Plan, Finish),
    /// `seriesByTag`: the evaluator reads the series its expressions match (as graphite-web's
    /// evaluator hands the call to the store).
    Tagged,
}

/// A read a [`Plan`] asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Fetch {
    /// The first argument's target again, over another range.
    First { from: i64, until: i64 },
    /// Another target, over the request's range.
    Target(String),
    /// The times of the DogStatsD events and service checks logged over the request's range
    /// (all of them, or those with every one of the tags): one series whose values are the
    /// times, in order.
    Events(Vec<String>),
}

/// One function, declared once.
pub struct Function {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub group: Group,
    pub description: &'static str,
    pub params: &'static [Param],
    /// graphite-web's `.aggregator`: a callback of `groupByNode` and the like may name it.
    pub aggregator: bool,
    /// Treats each series of its first argument alone, from nothing but that series and its
    /// other arguments (values), keeping its times and number of points: its answer for a list
    /// is its answers for each series in turn, so a streamed render may apply it a part at a
    /// time (`graphite::Streamed`; held by `tests.rs`,
    /// `per_series_functions_answer_a_list_as_its_series_one_by_one`).
    pub per_series: bool,
    pub body: Body,
}

impl Function {
    pub const fn new(
        name: &'static str,
        group: Group,
        params: &'static [Param],
        body: Body,
        description: &'static str,
    ) -> Function {
        Function {
            name,
            aliases: &[],
            group,
            description,
            params,
            aggregator: false,
            per_series: false,
            body,
        }
    }
    pub const fn aliases(self, aliases: &'static [&'static str]) -> Function {
        Function { aliases, ..self }
    }
    pub const fn aggregator(self) -> Function {
        Function {
            aggregator: true,
            ..self
        }
    }
    pub const fn per_series(self) -> Function {
        Function {
            per_series: true,
            ..self
        }
    }
}

/// Every declaration, by group.
fn declarations() -> impl Iterator<Item = &'static Function> {
    [
        combine::FUNCTIONS,
        transform::FUNCTIONS,
        calculate::FUNCTIONS,
        filter::FUNCTIONS,
        sorting::FUNCTIONS,
        alias::FUNCTIONS,
        graph::FUNCTIONS,
        special::FUNCTIONS,
    ]
    .into_iter()
    .flatten()
}

static BY_NAME: LazyLock<HashMap<&'static str, &'static Function>> = LazyLock::new(|| {
    let mut map = HashMap::new();
    for f in declarations() {
        for name in std::iter::once(&f.name).chain(f.aliases) {
            let before = map.insert(*name, f);
            assert!(before.is_none(), "{name} is declared twice");
        }
    }
    map
});

/// The function a name (or alias) calls.
pub fn find(name: &str) -> Option<&'static Function> {
    BY_NAME.get(name).copied()
}

/// Every name the render API takes, aliases included, sorted.
pub fn names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = BY_NAME.keys().copied().collect();
    names.sort_unstable();
    names
}

pub fn unknown(name: &str) -> GraphiteError {
    bad(format!("Received request for unknown function: {name}"))
}

/// What a function may read of the request and leave for the next: its range, `now`, and
/// graphite-web's request context (the `xFilesFactor` that `setXFilesFactor` sets, `stacked`'s
/// running totals).
pub struct Ctx<'s> {
    pub from: i64,
    pub until: i64,
    pub now: i64,
    pub state: &'s mut State,
}

/// The part of graphite-web's request context that functions write.
#[derive(Debug, Default)]
pub struct State {
    pub xff: Option<f64>,
    pub stacks: HashMap<String, Vec<f64>>,
}

impl Ctx<'_> {
    /// The request's xFilesFactor unless `given`.
    pub fn xff(&self, given: Option<f64>) -> f64 {
        given.or(self.state.xff).unwrap_or(0.0)
    }
}

/// A function's arguments, bound to its parameters and converted to their types.
#[derive(Debug)]
pub struct Args {
    /// The name the function was called by.
    pub called: String,
    params: &'static [Param],
    values: Vec<Option<Arg>>,
    /// The values of a `multiple` last parameter.
    rest: Vec<Arg>,
}

impl Args {
    /// Argument `i`: given, else the declared default.
    pub fn arg(&self, i: usize) -> Option<Arg> {
        match self.values.get(i) {
            Some(Some(a)) => Some(a.clone()),
            _ => self
                .params
                .get(i)
                .and_then(|p| p.default)
                .map(Lit::arg)
                .filter(|a| !matches!(a, Arg::None)),
        }
    }

    /// Whether argument `i` was given (not `None`).
    pub fn given(&self, i: usize) -> bool {
        matches!(self.values.get(i), Some(Some(_)))
    }

    /// The series of argument `i`, borrowed (a plan reads them; the body takes them).
    pub fn peek_series(&self, i: usize) -> &[Series] {
        match self.values.get(i) {
            Some(Some(Arg::Series(s))) => s,
            _ => &[],
        }
    }

    /// The series of argument `i` (taken: asked twice, the second answer is empty).
    pub fn series(&mut self, i: usize) -> Vec<Series> {
        match self.values.get_mut(i).map(Option::take) {
            Some(Some(Arg::Series(s))) => s,
            _ => Vec::new(),
        }
    }

    pub fn opt_float(&self, i: usize) -> Option<f64> {
        self.arg(i).and_then(|a| a.number().ok())
    }

    pub fn float(&self, i: usize) -> f64 {
        self.opt_float(i).unwrap_or(0.0)
    }

    pub fn opt_int(&self, i: usize) -> Option<i64> {
        match self.arg(i)? {
            Arg::Int(n) => Some(n),
            a => a.number().ok().map(|f| f as i64),
        }
    }

    pub fn int(&self, i: usize) -> i64 {
        self.opt_int(i).unwrap_or(0)
    }

    pub fn opt_text(&self, i: usize) -> Option<String> {
        self.arg(i).map(|a| a.text())
    }

    pub fn text(&self, i: usize) -> String {
        self.opt_text(i).unwrap_or_default()
    }

    pub fn boolean(&self, i: usize) -> bool {
        self.arg(i).is_some_and(|a| a.truthy())
    }

    /// The values of the `multiple` parameter.
    pub fn rest(&self) -> &[Arg] {
        &self.rest
    }

    /// The series lists of the `multiple` parameter, each taken.
    pub fn lists(&mut self) -> Vec<Vec<Series>> {
        std::mem::take(&mut self.rest)
            .into_iter()
            .filter_map(|a| match a {
                Arg::Series(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    /// Every series of the `multiple` parameter, in order.
    pub fn all_series(&mut self) -> Vec<Series> {
        self.lists().into_iter().flatten().collect()
    }
}

/// Binds a call's arguments to `f`'s parameters as graphite-web's `validateParams` does:
/// positional first (the rest to a `multiple` last parameter), then keywords by name; each value
/// converted to its parameter's type. An error names the function and the parameter.
pub fn bind(
    f: &'static Function,
    called: &str,
    args: Vec<Arg>,
    mut kwargs: Vec<(String, Arg)>,
) -> Result<Args> {
    let params = f.params;
    let multiple = params.last().is_some_and(|p| p.multiple);
    let count = args.len() + kwargs.len();
    if count > params.len() && !multiple {
        return Err(bad(format!(
            "Too many parameters specified for function \"{called}\""
        )));
    }
    let mut bound = Args {
        called: called.to_string(),
        params,
        values: vec![None; params.len()],
        rest: Vec::new(),
    };
    let positional = args.len();
    for (i, a) in args.into_iter().enumerate() {
        let at = i.min(params.len().saturating_sub(1));
        let Some(p) = params.get(at) else {
            return Err(bad(format!(
                "Too many parameters specified for function \"{called}\""
            )));
        };
        bound.put(at, convert(called, p, a)?);
    }
    let by_keyword = if count > params.len() {
        &[][..]
    } else {
        &params[positional.min(params.len())..]
    };
    for (offset, p) in by_keyword.iter().enumerate() {
        let at = positional + offset;
        match kwargs.iter().position(|(k, _)| k == p.name) {
            Some(j) => {
                let (_, a) = kwargs.remove(j);
                bound.put(at, convert(called, p, a)?);
            }
            None if p.required => {
                return Err(bad(format!(
                    "Missing required parameter \"{}\" for function \"{called}\"",
                    p.name
                )));
            }
            None => {}
        }
    }
    if !kwargs.is_empty() {
        let keys: Vec<&str> = kwargs.iter().map(|(k, _)| k.as_str()).collect();
        return Err(bad(format!(
            "Unexpected key word arguments: {}",
            keys.join(", ")
        )));
    }
    for (i, p) in params.iter().enumerate() {
        let missing = if p.multiple {
            bound.rest.is_empty()
        } else {
            bound.values[i].is_none()
        };
        if p.required && p.default.is_none() && missing {
            return Err(bad(format!(
                "Missing required parameter \"{}\" for function \"{called}\"",
                p.name
            )));
        }
    }
    Ok(bound)
}

impl Args {
    fn put(&mut self, at: usize, value: Option<Arg>) {
        match (self.params[at].multiple, value) {
            (true, Some(v)) => self.rest.push(v),
            (false, v) => self.values[at] = v,
            (true, None) => {}
        }
    }
}

/// A value as its parameter's type takes it (`None` for Python's `None`). Options are not
/// checked here: graphite-web lists them but (unless `ENFORCE_INPUT_VALIDATION`, off by
/// default) calls the function anyway, and the functions whose options matter check them.
fn convert(called: &str, p: &Param, a: Arg) -> Result<Option<Arg>> {
    if matches!(a, Arg::None) {
        return Ok(None);
    }
    let invalid = |a: &Arg| {
        bad(format!(
            "Invalid \"{}\" value specified for function \"{called}\" parameter \"{}\": {}",
            p.ty.name(),
            p.name,
            a.python_repr()
        ))
    };
    let integer = |a: &Arg| -> Option<i64> {
        match a {
            Arg::Int(n) => Some(*n),
            Arg::Bool(b) => Some(i64::from(*b)),
            Arg::Float(f) if f.fract() == 0.0 && f.abs() < 9e15 => Some(*f as i64),
            Arg::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    };
    Ok(Some(match p.ty {
        Type::SeriesList | Type::SeriesLists => match a {
            Arg::Series(_) => a,
            other => return Err(invalid(&other)),
        },
        Type::Float => match &a {
            Arg::Str(s) => Arg::Float(python_float(s).ok_or_else(|| invalid(&a))?),
            Arg::Series(_) => return Err(invalid(&a)),
            other => Arg::Float(other.number()?),
        },
        Type::Integer | Type::Node => Arg::Int(integer(&a).ok_or_else(|| invalid(&a))?),
        Type::IntOrInf => match integer(&a) {
            Some(n) => Arg::Int(n),
            None => match &a {
                Arg::Float(f) if *f == f64::INFINITY => a,
                Arg::Str(s) if python_float(s) == Some(f64::INFINITY) => Arg::Float(f64::INFINITY),
                _ => return Err(invalid(&a)),
            },
        },
        Type::Boolean => Arg::Bool(match &a {
            Arg::Bool(b) => *b,
            Arg::Str(s) if s.eq_ignore_ascii_case("true") => true,
            Arg::Str(s) if s.eq_ignore_ascii_case("false") => false,
            Arg::Int(0) => false,
            Arg::Int(1) => true,
            Arg::Float(f) if *f == 0.0 => false,
            Arg::Float(f) if *f == 1.0 => true,
            _ => return Err(invalid(&a)),
        }),
        Type::Interval => match &a {
            Arg::Str(s) if offset(s).is_ok() => a,
            _ => return Err(invalid(&a)),
        },
        Type::IntOrInterval => match &a {
            Arg::Str(_) => a,
            other => Arg::Int(integer(other).ok_or_else(|| invalid(&a))?),
        },
        Type::NodeOrTag => match &a {
            Arg::Float(_) | Arg::Bool(_) => integer(&a).map_or(a, Arg::Int),
            Arg::Series(_) => return Err(invalid(&a)),
            _ => a,
        },
        Type::Str | Type::Tag => match &a {
            Arg::Series(_) => return Err(invalid(&a)),
            other => Arg::Str(other.text()),
        },
        Type::AggFunc | Type::AggOrSeriesFunc => {
            let name = match &a {
                Arg::Str(s) => s.clone(),
                _ => return Err(invalid(&a)),
            };
            let known = agg_func(&name).is_some()
                || name
                    .strip_suffix("Series")
                    .is_some_and(|f| agg_func(f).is_some())
                || (p.ty == Type::AggOrSeriesFunc && find(&name).is_some());
            if !known {
                return Err(bad(format!("Unsupported aggregation function: {name}")));
            }
            a
        }
        Type::Any | Type::Date => a,
    }))
}

/// Python's `float()` of a string: surrounding space, `inf`, `nan`, exponents.
pub fn python_float(s: &str) -> Option<f64> {
    let t = s.trim().replace('_', "");
    match t.to_ascii_lowercase().trim_start_matches(['+', '-']) {
        "inf" | "infinity" | "nan" => {}
        rest if rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') => {}
        _ => return None,
    }
    t.parse().ok()
}

/// A function's entry in `/functions` (graphite-web's `functionInfo`), under `name`.
pub fn info(name: &str, f: &Function) -> Value {
    let signature: Vec<String> = f
        .params
        .iter()
        .map(|p| {
            if p.multiple {
                format!("*{}", p.name)
            } else if let Some(d) = p.default {
                format!("{}={}", p.name, d.python_str())
            } else if p.required {
                p.name.to_string()
            } else {
                format!("{}=None", p.name)
            }
        })
        .collect();
    let params: Vec<Value> = f.params.iter().map(param_json).collect();
    json!({
        "name": name,
        "function": format!("{name}({})", signature.join(", ")),
        "description": f.description,
        "module": "graphite.render.functions",
        "group": f.group.name(),
        "params": params,
    })
}

fn param_json(p: &Param) -> Value {
    let mut v = json!({ "name": p.name, "type": p.ty.name() });
    if p.required {
        v["required"] = json!(true);
    }
    if let Some(d) = p.default.filter(|d| *d != Lit::None) {
        v["default"] = d.json();
    }
    if p.multiple {
        v["multiple"] = json!(true);
    }
    let options = options(p);
    if !options.is_empty() {
        v["options"] = Value::Array(options);
    }
    if !p.suggestions.is_empty() {
        v["suggestions"] = Value::Array(p.suggestions.iter().map(|s| s.json()).collect());
    }
    v
}

/// A parameter's options and its type's (the aggregation functions), distinct, sorted by
/// Python's `str` as graphite-web sorts them.
fn options(p: &Param) -> Vec<Value> {
    let mut all: Vec<(String, Value)> = p
        .options
        .iter()
        .map(|o| (o.python_str(), o.json()))
        .collect();
    let mut names: Vec<&str> = Vec::new();
    if matches!(p.ty, Type::AggFunc | Type::AggOrSeriesFunc) {
        names.extend(AGG_FUNCS);
    }
    if p.ty == Type::AggOrSeriesFunc {
        names.extend(names_where(|f| f.aggregator));
    }
    all.extend(names.into_iter().map(|n| (n.to_string(), json!(n))));
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all.dedup_by(|a, b| a.0 == b.0);
    all.into_iter().map(|(_, v)| v).collect()
}

fn names_where(keep: impl Fn(&Function) -> bool) -> Vec<&'static str> {
    names()
        .into_iter()
        .filter(|n| find(n).is_some_and(&keep))
        .collect()
}

/// The `/functions` index: every name's entry, or those of one group; `grouped` nests them by
/// group. Infinity is written `1e9999`, as graphite-web's encoder writes it.
pub fn index_json(group: Option<&str>, grouped: bool) -> String {
    let mut index = serde_json::Map::new();
    for name in names() {
        let Some(f) = find(name) else { continue };
        if group.is_some_and(|g| g != f.group.name()) {
            continue;
        }
        let entry = info(name, f);
        if grouped {
            let by_group = index
                .entry(f.group.name().to_string())
                .or_insert_with(|| json!({}));
            by_group[name] = entry;
        } else {
            index.insert(name.to_string(), entry);
        }
    }
    with_infinity(Value::Object(index))
}

/// JSON text with the infinity marker written as graphite-web writes infinity.
pub fn with_infinity(v: Value) -> String {
    v.to_string().replace(&format!("\"{INF_MARK}\""), "1e9999")
}

// ---------------------------------------------------------------------------------------------
// What several groups share: graphite-web's `safe` and aggregation functions, naming by nodes,
// the aggregate, summarizing.

/// The aggregation functions' names (graphite-web's `aggFuncs` and `aggFuncAliases`).
pub const AGG_FUNCS: &[&str] = &[
    "average", "avg_zero", "median", "sum", "min", "max", "diff", "stddev", "count", "range",
    "multiply", "last", "rangeOf", "avg", "total", "current",
];

/// An aggregation over a row or a series' points.
pub type AggFn = fn(&[Point]) -> Point;

/// An aggregation function by name (graphite-web's `getAggFunc`).
pub fn agg_func(name: &str) -> Option<AggFn> {
    Some(match name {
        "average" | "avg" => safe_avg,
        "avg_zero" => |row| {
            (!row.is_empty()).then(|| {
                sum(&row.iter().map(|p| p.unwrap_or(0.0)).collect::<Vec<_>>()) / row.len() as f64
            })
        },
        "median" => safe_median,
        "sum" | "total" => safe_sum,
        "min" => safe_min,
        "max" => safe_max,
        "diff" => |row| {
            let mut values = row.iter().flatten();
            let first = *values.next()?;
            Some(values.fold(first, |a, b| a + -b))
        },
        "stddev" => |row| {
            let avg = safe_avg(row)?;
            let n = row.iter().flatten().count() as f64;
            let sq = row
                .iter()
                .flatten()
                .fold(0.0, |a, x| a + (x - avg) * (x - avg));
            Some((sq / n).sqrt())
        },
        "count" => |row| Some(row.iter().flatten().count() as f64),
        "range" | "rangeOf" => |row| Some(safe_max(row)? - safe_min(row)?),
        "multiply" => |row| {
            if row.iter().any(Option::is_none) {
                return None;
            }
            row.iter().flatten().copied().reduce(|a, b| a * b)
        },
        "last" | "current" => safe_last,
        _ => return None,
    })
}

/// [`agg_func`], or graphite-web's error.
pub fn agg(name: &str) -> Result<AggFn> {
    agg_func(name).ok_or_else(|| bad(format!("Unsupported aggregation function: {name}")))
}

pub fn present(points: &[Point]) -> Vec<f64> {
    points.iter().flatten().copied().collect()
}

/// Python's `sum` over floats: left to right from 0.
pub fn sum(values: &[f64]) -> f64 {
    values.iter().fold(0.0, |a, b| a + b)
}

pub fn safe_sum(points: &[Point]) -> Point {
    let mut values = points.iter().flatten();
    let first = *values.next()?;
    Some(values.fold(0.0 + first, |a, b| a + b))
}

pub fn safe_avg(points: &[Point]) -> Point {
    let n = points.iter().flatten().count();
    safe_sum(points).map(|s| s / n as f64)
}

pub fn safe_min(points: &[Point]) -> Point {
    points.iter().flatten().copied().reduce(f64::min)
}

pub fn safe_max(points: &[Point]) -> Point {
    points.iter().flatten().copied().reduce(f64::max)
}

pub fn safe_last(points: &[Point]) -> Point {
    points.iter().rev().flatten().next().copied()
}

pub fn safe_median(points: &[Point]) -> Point {
    let mut v = present(points);
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    match v.len() {
        0 => None,
        n if n % 2 == 0 => Some((v[mid - 1] + v[mid]) / 2.0),
        _ => Some(v[mid]),
    }
}

/// graphite-web's `safeDiv`.
pub fn safe_div(a: Point, b: Point) -> Point {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => Some(a / b),
        _ => None,
    }
}

/// graphite-web's `safePow` (`math.pow`, null where Python raises: a negative base to a
/// fraction, zero to a negative power, an overflow).
pub fn safe_pow(a: Point, b: Point) -> Point {
    let (a, b) = (a?, b?);
    let r = a.powf(b);
    (r.is_finite() || !(a.is_finite() && b.is_finite())).then_some(r)
}

/// Python's `round(x, 6)`: half to even on the exact value (the quick way unless the
/// millionths are within a hair of a half).
pub fn round6(v: f64) -> f64 {
    let scaled = v * 1e6;
    if !scaled.is_finite() {
        return v;
    }
    if ((scaled - scaled.trunc()).abs() - 0.5).abs() < 1e-3 {
        return transform::python_round(v, 6);
    }
    scaled.round() / 1e6
}

/// graphite-web's `formatPathExpressions`: the distinct path expressions, in order, joined.
pub fn path_expressions(series: &[Series]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for s in series {
        if !seen.contains(&s.path_expression.as_str()) {
            seen.push(&s.path_expression);
        }
    }
    seen.join(",")
}

/// graphite-web's `aggregate`: one series, `<func>Series(<path expressions>)`, or none for no
/// series. `func` may carry graphite-web's deprecated `Series` suffix.
pub fn aggregate(
    mut list: Vec<Series>,
    func: &str,
    xff: Option<f64>,
    ctx: &Ctx,
) -> Result<Vec<Series>> {
    let func = func.strip_suffix("Series").unwrap_or(func);
    let f =
        agg_func(func).ok_or_else(|| bad(format!("Unsupported aggregation function: {func}")))?;
    let Some((start, end, step)) = normalize(&mut list) else {
        return Ok(Vec::new());
    };
    let xff = ctx.xff(xff);
    let name = format!("{func}Series({})", path_expressions(&list));
    // A row without enough values is null, whatever the function (graphite-web's `xffValues`).
    let values: Vec<Point> = rows(&list)
        .iter()
        .map(|row| xff_values(row, xff).then(|| f(row)).flatten())
        .collect();
    // The tags every input has alike, then the new name if `name` differed, then how.
    let mut tags = list[0].tags.clone();
    tags.0
        .retain(|(k, v)| list.iter().all(|s| s.tags.get(k) == Some(v.as_str())));
    if tags.get("name").is_none() {
        tags.set("name", name.clone());
    }
    tags.set("aggregatedBy", func);
    let mut out = Series::new(&name, start, end, step, values);
    out.tags = tags;
    out.x_files_factor = xff;
    Ok(vec![out])
}

/// graphite-web's `xffValues`: enough of the row is present.
pub fn xff_values(row: &[Point], xff: f64) -> bool {
    xff_ok(row.iter().flatten().count(), row.len() as f64, xff)
}

/// graphite-web's `xff`.
pub fn xff_ok(present: usize, total: f64, xff: f64) -> bool {
    present > 0 && total > 0.0 && present as f64 / total >= xff
}

/// Node `n` of a series' name (the part before the first `;`, split on `.`), or, when `n` is no
/// node index there, the tag `n`; `''` when neither (graphite-web's `getNodeOrTag`).
pub fn node_or_tag(series: &Series, n: &Arg, path: Option<&str>) -> String {
    if let Some(i) = n.as_index() {
        let name = path.unwrap_or(&series.name);
        let nodes: Vec<&str> = name.split(';').next().unwrap_or("").split('.').collect();
        let at = if i < 0 { nodes.len() as i64 + i } else { i };
        if let Some(node) = usize::try_from(at).ok().and_then(|at| nodes.get(at)) {
            return node.to_string();
        }
    }
    series.tags.get(&n.text()).unwrap_or("").to_string()
}

/// graphite-web's `aggKey`: the nodes (or tags) joined with `.`; a name that ends in `)` is
/// read through its first path expression.
pub fn agg_key(series: &Series, nodes: &[Arg]) -> String {
    let path = series
        .name
        .ends_with(')')
        .then(|| first_path_expression(&series.name))
        .flatten();
    nodes
        .iter()
        .map(|n| node_or_tag(series, n, path.as_deref()))
        .collect::<Vec<_>>()
        .join(".")
}

/// The first path expression inside a function-wrapped name (`sumSeries(a.b,c)` → `a.b`).
pub fn first_path_expression(name: &str) -> Option<String> {
    let mut e = super::expr::parse(name).ok()?;
    loop {
        match e {
            super::expr::Expr::Path(p) => return Some(p),
            super::expr::Expr::Call(mut c) if !c.args.is_empty() => e = c.args.swap_remove(0),
            _ => return None,
        }
    }
}

/// Groups by `key`, in first-seen order.
pub fn group_in_order(
    list: Vec<Series>,
    key: impl Fn(&Series) -> String,
) -> Vec<(String, Vec<Series>)> {
    let mut groups: Vec<(String, Vec<Series>)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for s in list {
        let k = key(&s);
        match at.get(&k) {
            Some(&i) => groups[i].1.push(s),
            None => {
                at.insert(k.clone(), groups.len());
                groups.push((k, vec![s]));
            }
        }
    }
    groups
}

/// Applies a callback to a group: a declared function given the group as its one list, or an
/// aggregation (graphite-web's `groupByNodes`); its first series.
pub fn callback(name: &str, group: Vec<Series>, ctx: &mut Ctx) -> Result<Option<Series>> {
    let out = if find(name).is_some() {
        call(name, vec![Arg::Series(group)], ctx)?
    } else {
        aggregate(group, name, None, ctx)?
    };
    Ok(out.into_iter().next())
}

/// Calls a declared function with positional arguments (a callback, `reduceSeries`' function).
pub fn call(name: &str, args: Vec<Arg>, ctx: &mut Ctx) -> Result<Vec<Series>> {
    let f = find(name).ok_or_else(|| unknown(name))?;
    let mut bound = bind(f, name, args, Vec::new())?;
    match f.body {
        Body::Apply(apply) => apply(&mut bound, ctx),
        Body::Refetch(..) | Body::Shaped(..) | Body::Tagged => Err(bad(format!(
            "{name} reads series of its own and cannot be called by another function"
        ))),
    }
}

/// A function of each value, as graphite-web's `scale`, `offset`, `absolute`… apply it in
/// place: each series renamed `<function>(<name><shown>)` and tagged `<function>=<tag>`.
pub fn per_value(
    mut list: Vec<Series>,
    function: &str,
    tag: &str,
    shown: &str,
    f: impl Fn(Point) -> Point,
) -> Vec<Series> {
    for s in &mut list {
        s.tags.set(function, tag);
        s.rename(format!("{function}({}{shown})", s.name));
        map_values(s, &f);
    }
    list
}

/// Replaces every stored value (graphite-web's in-place `series[i] = f(series[i])`).
pub fn map_values(s: &mut Series, f: impl Fn(Point) -> Point) {
    for v in &mut s.values {
        *v = f(*v);
    }
}

/// The series' points through `f`, as a new series named `name` (graphite-web's
/// `series.copy(name=…, values=…)`), tagged `tag=value` first.
pub fn derive(
    mut s: Series,
    tag: (&str, String),
    name: String,
    f: impl FnOnce(&Series, Vec<Point>) -> Vec<Point>,
) -> Series {
    s.tags.set(tag.0, tag.1);
    let values = f(&s, s.points().into_owned());
    s.derived(name, values)
}

/// graphite-web's `parseTimeOffset`, in signed seconds (`'1h'` is +3600, `'-1d'` -86400).
pub fn offset(text: &str) -> Result<i64> {
    let t = text.trim();
    if t.is_empty() {
        return Err(bad(format!("Invalid interval value: {text:?}")));
    }
    let signed = if t.starts_with(['+', '-']) {
        t.to_string()
    } else {
        format!("+{t}")
    };
    super::attime::parse(&format!("now{signed}"), 0)
        .map_err(|e| bad(format!("Invalid interval value: {text:?}: {e}")))
}

/// An interval's length in seconds, positive (`summarize`'s, `hitcount`'s).
pub fn interval_secs(text: &str) -> Result<i64> {
    let secs = offset(text)?;
    if secs <= 0 {
        return Err(bad(format!("interval {text:?} is not positive")));
    }
    Ok(secs)
}

/// Refuses `points` past [`MAX_POINTS`].
pub fn bounded(what: &str, points: i64) -> Result<()> {
    if points > MAX_POINTS {
        return Err(bad(format!(
            "{what} would make {points} points of one series, more than {MAX_POINTS}, the limit"
        )));
    }
    Ok(())
}

/// graphite-web's `_summarizeValues`.
pub fn summarize_values(
    s: &Series,
    f: AggFn,
    interval: i64,
    start: i64,
    end: i64,
) -> (Vec<Point>, i64) {
    let points = s.points();
    let step = s.step * s.values_per_point.max(1) as i64;
    let stamps: Vec<i64> = (0..)
        .map(|i| s.start + i * step)
        .take_while(|t| *t < s.end)
        .collect();
    let n = stamps.len().min(points.len());
    let interval_points = interval as f64 / s.step as f64;
    let (mut i, mut t) = (0usize, start);
    let mut out = Vec::new();
    while t < end {
        let mut first = i;
        let mut non_null = 0;
        while i < n && stamps[i] < t + interval {
            if stamps[i] <= t {
                first = i;
            }
            if stamps[i] >= t && points[i].is_some() {
                non_null += 1;
            }
            i += 1;
        }
        let enough = xff_ok(non_null, interval_points, s.x_files_factor);
        out.push(if enough { f(&points[first..i]) } else { None });
        t += interval;
    }
    (out, t)
}

/// graphite-web's `_getPercentile`.
pub fn percentile(points: &[Point], n: f64, interpolate: bool) -> Point {
    let mut sorted = present(points);
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return None;
    }
    let fractional = (n / 100.0) * (sorted.len() as f64 + 1.0);
    let mut rank = fractional.trunc() as i64;
    let fraction = fractional - rank as f64;
    if !interpolate {
        rank += fraction.ceil() as i64;
    }
    let len = sorted.len() as i64;
    let mut p = if rank <= 0 {
        sorted[0]
    } else if rank > len {
        sorted[sorted.len() - 1]
    } else {
        sorted[(rank - 1) as usize]
    };
    if interpolate && rank != len && rank >= 0 && rank < len {
        p += fraction * (sorted[rank as usize] - p);
    }
    Some(p)
}

/// Python's replacement text (`\1`, `\g<1>`, `\g<name>`) in the regex crate's (`${1}`).
pub fn python_replacement(replace: &str) -> String {
    let chars: Vec<char> = replace.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '$' => out.push_str("$$"),
            '\\' if i + 1 < chars.len() => {
                let next = chars[i + 1];
                if next.is_ascii_digit() {
                    let digits: String = chars[i + 1..]
                        .iter()
                        .take(2)
                        .take_while(|c| c.is_ascii_digit())
                        .collect();
                    out.push_str(&format!("${{{digits}}}"));
                    i += 1 + digits.len();
                    continue;
                }
                if next == 'g'
                    && chars.get(i + 2) == Some(&'<')
                    && let Some(close) = chars[i + 3..].iter().position(|c| *c == '>')
                {
                    let group: String = chars[i + 3..i + 3 + close].iter().collect();
                    out.push_str(&format!("${{{group}}}"));
                    i += 4 + close;
                    continue;
                }
                match next {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    '\\' => out.push('\\'),
                    other => {
                        out.push('\\');
                        out.push(other);
                    }
                }
                i += 2;
                continue;
            }
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// A Python regular expression (`re`), compiled; the error names the function.
pub fn regex(function: &str, pattern: &str) -> Result<regex::Regex> {
    regex::Regex::new(pattern).map_err(|e| {
        bad(format!(
            "{function}: bad regular expression {pattern:?}: {e}"
        ))
    })
}

/// Python's `re.sub(search, replace, name)`.
pub fn substitute(function: &str, search: &str, replace: &str, name: &str) -> Result<String> {
    let re = regex(function, search)?;
    Ok(re
        .replace_all(name, python_replacement(replace).as_str())
        .into_owned())
}

/// The indices of Python's `list[start:stop]` of a list of `len` (a negative index counts
/// from the end; `None` is the end).
pub fn python_range(len: usize, start: Option<i64>, stop: Option<i64>) -> std::ops::Range<usize> {
    let len = len as i64;
    let at = |i: i64| if i < 0 { (len + i).max(0) } else { i.min(len) } as usize;
    let (from, to) = (at(start.unwrap_or(0)), at(stop.unwrap_or(len)));
    from..to.max(from)
}

#[cfg(test)]
mod tests;
