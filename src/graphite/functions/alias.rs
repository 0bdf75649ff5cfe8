//! graphite-web's Alias group: functions that rename series, their values untouched.

use super::Type::*;
use super::*;
use crate::graphite::pyfmt::repr_string;

const POSITIONS: Param = Param::new("pos", Integer).multiple();

pub(super) const FUNCTIONS: &[Function] = &[
    Function::new(
        "alias",
        Group::Alias,
        &[SERIES, Param::new("newName", Str).required()],
        Body::Apply(|a, _| {
            let name = a.text(1);
            let mut list = a.series(0);
            for s in &mut list {
                s.name = name.clone();
            }
            Ok(list)
        }),
        "Names every series newName.",
    )
    .per_series(),
    Function::new(
        "aliasByMetric",
        Group::Alias,
        &[SERIES],
        Body::Apply(|a, _| Ok(special::substr(a.series(0), -1, 0))),
        "Names each series by the last node of its name.",
    )
    .per_series(),
    Function::new(
        "aliasByNode",
        Group::Alias,
        &[SERIES, Param::new("nodes", NodeOrTag).required().multiple()],
        Body::Apply(by_nodes),
        "Names each series by nodes of its name, or by its tags.",
    )
    .per_series(),
    Function::new(
        "aliasByTags",
        Group::Alias,
        &[SERIES, Param::new("tags", NodeOrTag).required().multiple()],
        Body::Apply(by_nodes),
        "Names each series by its tags, or nodes of its name.",
    )
    .per_series(),
    Function::new(
        "aliasQuery",
        Group::Alias,
        &[
            SERIES,
            Param::new("search", Str).required(),
            Param::new("replace", Str).required(),
            Param::new("newName", Str).required(),
        ],
        Body::Refetch(
            |a, _| {
                let (search, replace) = (a.text(1), a.text(2));
                a.peek_series(0)
                    .iter()
                    .map(|s| {
                        substitute("aliasQuery", &search, &replace, &s.name).map(Fetch::Target)
                    })
                    .collect()
            },
            |a, _, fetched| {
                let (search, replace, format) = (a.text(1), a.text(2), a.text(3));
                let mut list = a.series(0);
                for (s, found) in list.iter_mut().zip(fetched) {
                    let query = substitute("aliasQuery", &search, &replace, &s.name)?;
                    let Some(first) = found.first() else {
                        return Err(bad(format!("No series found with query: {query}")));
                    };
                    let Some(current) = safe_last(&first.points()) else {
                        return Err(bad(format!(
                            "Cannot get last value of series: {}",
                            first.name
                        )));
                    };
                    s.name = percent_format(&format, current)?;
                }
                Ok(list)
            },
        ),
        "Names each series by a format of the last value of the series a query finds for it.",
    ),
    Function::new(
        "aliasSub",
        Group::Alias,
        &[
            SERIES,
            Param::new("search", Str).required(),
            Param::new("replace", Str).required(),
        ],
        Body::Apply(|a, _| {
            let re = regex("aliasSub", &a.text(1))?;
            let replace = python_replacement(&a.text(2));
            let mut list = a.series(0);
            for s in &mut list {
                s.name = re.replace_all(&s.name, replace.as_str()).into_owned();
            }
            Ok(list)
        }),
        "Renames the series with a regular expression and its replacement (\\1 for a group).",
    )
    .per_series(),
    Function::new(
        "legendValue",
        Group::Alias,
        &[
            SERIES,
            Param::new("valuesTypes", Str).multiple().options(&[
                Lit::Str("average"),
                Lit::Str("averageSeries"),
                Lit::Str("avg"),
                Lit::Str("avgSeries"),
                Lit::Str("avg_zero"),
                Lit::Str("avg_zeroSeries"),
                Lit::Str("binary"),
                Lit::Str("count"),
                Lit::Str("countSeries"),
                Lit::Str("current"),
                Lit::Str("currentSeries"),
                Lit::Str("diff"),
                Lit::Str("diffSeries"),
                Lit::Str("last"),
                Lit::Str("lastSeries"),
                Lit::Str("max"),
                Lit::Str("maxSeries"),
                Lit::Str("median"),
                Lit::Str("medianSeries"),
                Lit::Str("min"),
                Lit::Str("minSeries"),
                Lit::Str("multiply"),
                Lit::Str("multiplySeries"),
                Lit::Str("range"),
                Lit::Str("rangeOf"),
                Lit::Str("rangeOfSeries"),
                Lit::Str("rangeSeries"),
                Lit::Str("si"),
                Lit::Str("stddev"),
                Lit::Str("stddevSeries"),
                Lit::Str("sum"),
                Lit::Str("sumSeries"),
                Lit::Str("total"),
                Lit::Str("totalSeries"),
            ]),
        ],
        Body::Apply(|a, _| {
            let mut types: Vec<String> = a.rest().iter().map(Arg::text).collect();
            let system = match types.last().map(String::as_str) {
                None => return Err(bad("legendValue needs at least one value type".into())),
                Some(s @ ("si" | "binary")) => Some(s.to_string()),
                Some(_) => None,
            };
            if system.is_some() {
                types.pop();
            }
            let mut list = a.series(0);
            for t in &types {
                let f = agg_func(t);
                for s in &mut list {
                    let value = f.map(|f| f(&s.points()));
                    s.name = match &system {
                        None => {
                            let shown = match value {
                                None => "(?)".to_string(),
                                Some(None) => "None".to_string(),
                                Some(Some(v)) => repr_string(v),
                            };
                            format!("{} ({t}: {shown})", s.name)
                        }
                        Some(system) => {
                            let shown = match value {
                                None => "(?)".to_string(),
                                Some(None) => "None".to_string(),
                                Some(Some(v)) => {
                                    let (v, prefix) = format_units(v, system, None);
                                    format!("{v:.2}{prefix}")
                                }
                            };
                            format!("{:<20}{t:<5}{shown:<10}", s.name)
                        }
                    };
                }
            }
            Ok(list)
        }),
        "Adds aggregates of each series to its name (`(avg: 1.5)`).",
    ),
    Function::new(
        "lower",
        Group::Alias,
        &[SERIES, POSITIONS],
        Body::Apply(|a, _| Ok(change_case(a, false))),
        "The names in lower case, or the characters at the positions (graphite-web 1.1.10).",
    ),
    Function::new(
        "upper",
        Group::Alias,
        &[SERIES, POSITIONS],
        Body::Apply(|a, _| Ok(change_case(a, true))),
        "The names in upper case, or the characters at the positions (graphite-web 1.1.10).",
    ),
];

fn by_nodes(a: &mut Args, _: &mut Ctx) -> Result<Vec<Series>> {
    let nodes = a.rest().to_vec();
    let mut list = a.series(0);
    for s in &mut list {
        s.name = agg_key(s, &nodes);
    }
    Ok(list)
}

fn change_case(a: &mut Args, upper: bool) -> Vec<Series> {
    let positions: Vec<i64> = a.rest().iter().filter_map(Arg::as_index).collect();
    let case = |s: &str| {
        if upper {
            s.to_uppercase()
        } else {
            s.to_lowercase()
        }
    };
    let mut list = a.series(0);
    for s in &mut list {
        if positions.is_empty() {
            s.name = case(&s.name);
            continue;
        }
        let mut chars: Vec<String> = s.name.chars().map(String::from).collect();
        let len = chars.len() as i64;
        for &p in &positions {
            let at = if p < 0 { len + p } else { p };
            if let Some(c) = usize::try_from(at).ok().and_then(|i| chars.get_mut(i)) {
                *c = case(c);
            }
        }
        s.name = chars.concat();
    }
    list
}

/// graphite-web's `format_units`: the value in the unit system's largest unit it reaches, and
/// that unit's prefix (and `units`).
pub(super) fn format_units(v: f64, system: &str, units: Option<&str>) -> (f64, String) {
    let sizes: &[(&str, f64)] = match system {
        "binary" => &[
            ("Pi", 1125899906842624.0),
            ("Ti", 1099511627776.0),
            ("Gi", 1073741824.0),
            ("Mi", 1048576.0),
            ("Ki", 1024.0),
        ],
        _ => &[("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)],
    };
    let whole = |x: f64| {
        if x - x.floor() < 0.00000000001 && v > 1.0 {
            x.floor()
        } else {
            x
        }
    };
    for (prefix, size) in sizes {
        if v.abs() >= *size {
            let prefix = format!("{prefix}{}", units.unwrap_or(""));
            return (whole(v / size), prefix);
        }
    }
    (whole(v), units.unwrap_or("").to_string())
}

/// Python's `format % value` for one float: `%s`, `%d`/`%i`, `%f`/`%e`/`%g` with width and
/// precision, `%%`.
fn percent_format(format: &str, value: f64) -> Result<String> {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    let mut used = false;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = String::new();
        while let Some(&n) = chars.peek() {
            if n.is_ascii_digit() || matches!(n, '.' | '-' | '+' | ' ' | '#') {
                spec.push(n);
                chars.next();
            } else {
                break;
            }
        }
        let kind = chars
            .next()
            .ok_or_else(|| bad(format!("aliasQuery: incomplete format {format:?}")))?;
        if kind == '%' {
            out.push('%');
            continue;
        }
        if used {
            return Err(bad(format!(
                "aliasQuery: {format:?} wants more than the one value"
            )));
        }
        used = true;
        let left = spec.starts_with('-');
        let spec = spec.trim_start_matches(['-', '+', ' ', '#']);
        let (width, precision) = match spec.split_once('.') {
            Some((w, p)) => (w.parse::<usize>().unwrap_or(0), p.parse::<usize>().ok()),
            None => (spec.parse::<usize>().unwrap_or(0), None),
        };
        let text = match kind {
            's' | 'r' => repr_string(value),
            'd' | 'i' | 'u' => format!("{}", value.trunc() as i64),
            'f' | 'F' => format!("{value:.*}", precision.unwrap_or(6)),
            'e' | 'E' => {
                let s = format!("{value:.*e}", precision.unwrap_or(6));
                let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
                let e: i32 = e.parse().unwrap_or(0);
                let s = format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
                if kind == 'E' { s.to_uppercase() } else { s }
            }
            'g' | 'G' => crate::graphite::pyfmt::percent_g(value),
            other => {
                return Err(bad(format!(
                    "aliasQuery: %{other} is no format for a number"
                )));
            }
        };
        if left {
            out.push_str(&format!("{text:<width$}"));
        } else {
            out.push_str(&format!("{text:>width$}"));
        }
    }
    if !used {
        return Err(bad(format!(
            "aliasQuery: not all arguments converted during string formatting ({format:?} has no %)"
        )));
    }
    Ok(out)
}
