//! graphite-web's Sorting group.

use super::Type::*;
use super::*;

pub(super) const FUNCTIONS: &[Function] = &[
    Function::new(
        "sortBy",
        Group::Sorting,
        &[
            SERIES,
            Param::new("func", AggFunc).default(Lit::Str("average")),
            Param::new("reverse", Boolean).default(Lit::Bool(false)),
        ],
        Body::Apply(|a, _| {
            let func = a.text(1);
            let reverse = a.boolean(2);
            sort_by(a.series(0), agg(&func)?, reverse)
        }),
        "Sorts the series by an aggregate (the average by default), lowest first.",
    ),
    Function::new(
        "sortByMaxima",
        Group::Sorting,
        &[SERIES],
        Body::Apply(|a, _| sort_by(a.series(0), safe_max, true)),
        "Sorts the series by their maximum, highest first.",
    ),
    Function::new(
        "sortByMinima",
        Group::Sorting,
        &[SERIES],
        Body::Apply(|a, _| {
            let list = a
                .series(0)
                .into_iter()
                .filter(|s| safe_max(&s.points()).unwrap_or(0.0) > 0.0)
                .collect();
            sort_by(list, safe_min, false)
        }),
        "Sorts the series with a positive maximum by their minimum, lowest first.",
    ),
    Function::new(
        "sortByName",
        Group::Sorting,
        &[
            SERIES,
            Param::new("natural", Boolean).default(Lit::Bool(false)),
            Param::new("reverse", Boolean).default(Lit::Bool(false)),
        ],
        Body::Apply(|a, _| {
            let natural = a.boolean(1);
            let reverse = a.boolean(2);
            let mut keyed: Vec<(String, Series)> = a
                .series(0)
                .into_iter()
                .map(|s| {
                    let key = if natural {
                        natural_key(&s.name)
                    } else {
                        s.name.clone()
                    };
                    (key, s)
                })
                .collect();
            // Python's stable sort, reversed or not, keeps equal keys in their order.
            if reverse {
                keyed.sort_by(|x, y| y.0.cmp(&x.0));
            } else {
                keyed.sort_by(|x, y| x.0.cmp(&y.0));
            }
            Ok(keyed.into_iter().map(|(_, s)| s).collect())
        }),
        "Sorts the series by name (natural: numbers by value).",
    ),
    Function::new(
        "sortByTotal",
        Group::Sorting,
        &[SERIES],
        Body::Apply(|a, _| sort_by(a.series(0), safe_sum, true)),
        "Sorts the series by their sum, highest first.",
    ),
];

/// graphite-web's `sort(key=keyFunc(f), reverse=…)`: a series without an aggregate as
/// -infinity; stable either way.
fn sort_by(list: Vec<Series>, f: AggFn, reverse: bool) -> Result<Vec<Series>> {
    let mut keyed: Vec<(f64, Series)> = list
        .into_iter()
        .map(|s| (f(&s.points()).unwrap_or(f64::NEG_INFINITY), s))
        .collect();
    if reverse {
        keyed.sort_by(|x, y| y.0.total_cmp(&x.0));
    } else {
        keyed.sort_by(|x, y| x.0.total_cmp(&y.0));
    }
    Ok(keyed.into_iter().map(|(_, s)| s).collect())
}

/// `sortByName(natural=true)`'s key: every run of digits padded to ten.
fn natural_key(name: &str) -> String {
    let mut out = String::new();
    let mut digits = String::new();
    for c in name.chars().chain(std::iter::once('\0')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if !digits.is_empty() {
            let n: u128 = digits.parse().unwrap_or(0);
            out.push_str(&format!("{n:010}"));
            digits.clear();
        }
        if c != '\0' {
            out.push(c);
        }
    }
    out
}
