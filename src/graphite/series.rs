//! A series as graphite-web's `TimeSeries` holds it: values on a grid from `start` by `step`
//! (`end` exclusive), a name, the path expression it came from, its tags, and how it is
//! consolidated (`valuesPerPoint` values averaged, or summed…, into one point).

use std::borrow::Cow;

/// One point: `None` is a slice without data (graphite's `None`, `null` in JSON).
pub type Point = Option<f64>;

/// A series' tags, in the order graphite-web's dict keeps them (values always strings).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tags(pub Vec<(String, String)>);

impl Tags {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets `key`, in place if it is there, else at the end.
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.0.push((key.to_string(), value)),
        }
    }

    /// The tags of a series named `name` when graphite-web makes one without tags: parsed from
    /// a tagged name (`{k: v…, name}`), else `{name}`; a name that looks like a call
    /// (`sumSeries(…)`) is not parsed.
    pub fn of_name(name: &str) -> Tags {
        let looks_like_call = {
            let b = name.as_bytes();
            let letters = b.iter().take_while(|c| c.is_ascii_alphabetic()).count();
            letters > 0
                && b.get(letters) == Some(&b'(')
                && b.len() > letters + 2
                && name.ends_with(')')
        };
        if !looks_like_call && let Some(tagged) = super::names::parse_tagged(name) {
            return Tags(tagged.into_tags());
        }
        Tags(vec![("name".into(), name.to_string())])
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub path_expression: String,
    pub tags: Tags,
    pub start: i64,
    pub end: i64,
    pub step: i64,
    pub values: Vec<Point>,
    /// How points are consolidated when several make one (`maxDataPoints`, normalizing):
    /// `average` unless `consolidateBy` says otherwise.
    pub consolidation: String,
    pub values_per_point: usize,
    pub x_files_factor: f64,
}

impl Series {
    /// A series named `name` with tags as graphite-web gives a new one (see [`Tags::of_name`]).
    pub fn new(name: &str, start: i64, end: i64, step: i64, values: Vec<Point>) -> Series {
        Series {
            name: name.to_string(),
            path_expression: name.to_string(),
            tags: Tags::of_name(name),
            start,
            end,
            step,
            values,
            consolidation: "average".into(),
            values_per_point: 1,
            x_files_factor: 0.0,
        }
    }

    /// A copy with other values and name (graphite-web's `series.copy(name=…, values=…)`), its
    /// tags kept.
    pub fn with(&self, name: String, values: Vec<Point>) -> Series {
        Series {
            name,
            values,
            ..self.clone()
        }
    }

    /// What a function computing from [`Series::points`] makes of it: named `name`, which is
    /// its path expression too, its tags kept, one value per point.
    pub fn derived(&self, name: String, values: Vec<Point>) -> Series {
        Series {
            path_expression: name.clone(),
            name,
            values,
            values_per_point: 1,
            ..self.clone()
        }
    }

    /// Sets the name and makes it the path expression too, as most functions do.
    pub fn rename(&mut self, name: String) {
        self.path_expression = name.clone();
        self.name = name;
    }

    /// The values as graphite-web iterates them: consolidated `values_per_point` at a time
    /// (borrowed when there is nothing to consolidate: a week of minutes is 10 080 points).
    pub fn points(&self) -> Cow<'_, [Point]> {
        if self.values_per_point <= 1 {
            return Cow::Borrowed(&self.values);
        }
        let func = Consolidation::named(&self.consolidation);
        self.values
            .chunks(self.values_per_point)
            .map(|chunk| consolidate(func, chunk, self.values_per_point, self.x_files_factor))
            .collect()
    }

    /// The points graphite-web's `datapoints` gives times to (`start` by `step ×
    /// values_per_point`, up to `end`), and that step.
    pub fn timed_points(&self) -> (Cow<'_, [Point]>, i64) {
        let step = self.step * self.values_per_point.max(1) as i64;
        let mut points = self.points();
        if step > 0 {
            let timed = ((self.end - self.start).div_euclid(step) + 1).max(0) as usize;
            if timed < points.len() {
                match &mut points {
                    Cow::Borrowed(all) => *all = &all[..timed],
                    Cow::Owned(all) => all.truncate(timed),
                }
            }
        }
        (points, step)
    }
}

/// One consolidated point of `chunk` (`per_point` values, the last chunk maybe fewer) as
/// graphite-web's consolidating generator makes it: the function over the non-null values
/// (`avg_zero` counting nulls as 0), null when there are none or fewer than the x-files factor.
/// The values are walked where they lie, not gathered into a list of their own (a year's render
/// with `maxDataPoints` spent a fifth of its CPU allocating those lists), and the function is
/// named once a series, not compared by name a point.
fn consolidate(func: Consolidation, chunk: &[Point], per_point: usize, xff: f64) -> Point {
    let mut present = chunk.iter().flatten().copied();
    let known = present.clone().count();
    if known == 0 || (known as f64 / per_point as f64) < xff {
        return None;
    }
    let sum = || present.clone().fold(0.0, |a, b| a + b);
    match func {
        Consolidation::Sum => Some(sum()),
        Consolidation::Max => Some(present.fold(f64::NEG_INFINITY, f64::max)),
        Consolidation::Min => Some(present.fold(f64::INFINITY, f64::min)),
        Consolidation::First => present.next(),
        Consolidation::Last => present.last(),
        Consolidation::AvgZero => Some(sum() / chunk.len() as f64),
        Consolidation::Average => Some(sum() / known as f64),
    }
}

/// A consolidation function ([`CONSOLIDATIONS`]); any other name averages, as graphite-web's
/// consolidation does.
#[derive(Clone, Copy)]
enum Consolidation {
    Sum,
    Max,
    Min,
    First,
    Last,
    AvgZero,
    Average,
}

impl Consolidation {
    fn named(name: &str) -> Consolidation {
        match name {
            "sum" => Consolidation::Sum,
            "max" => Consolidation::Max,
            "min" => Consolidation::Min,
            "first" => Consolidation::First,
            "last" => Consolidation::Last,
            "avg_zero" => Consolidation::AvgZero,
            _ => Consolidation::Average,
        }
    }
}

/// The consolidation functions `consolidateBy` takes.
pub const CONSOLIDATIONS: [&str; 8] = [
    "sum", "average", "avg", "avg_zero", "min", "max", "first", "last",
];

/// graphite-web's `normalize`: every series consolidated to the least common multiple of the
/// steps; the common start, end (trimmed to a whole step) and step. `None` without series.
pub fn normalize(series: &mut [Series]) -> Option<(i64, i64, i64)> {
    let step = series.iter().map(|s| s.step).reduce(lcm)?;
    for s in series.iter_mut() {
        s.values_per_point = (step / s.step).max(1) as usize;
    }
    let start = series.iter().map(|s| s.start).min()?;
    let mut end = series.iter().map(|s| s.end).max()?;
    end -= (end - start) % step;
    Some((start, end, step))
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

pub fn lcm(a: i64, b: i64) -> i64 {
    if a == b { a } else { a / gcd(a, b) * b }
}

/// Rows of the consolidated points of `series`, the shorter ones padded with nulls
/// (`izip_longest`).
pub fn rows(series: &[Series]) -> Vec<Vec<Point>> {
    let points: Vec<_> = series.iter().map(Series::points).collect();
    let n = points.iter().map(|p| p.len()).max().unwrap_or(0);
    (0..n)
        .map(|i| points.iter().map(|p| p.get(i).copied().flatten()).collect())
        .collect()
}

/// The `maxDataPoints` consolidation graphite-web's JSON renderer applies to every series of
/// a response (`time_range`: the latest end minus the earliest start over all of them).
pub fn fit(series: &mut Series, max_points: usize, time_range: i64) {
    if max_points == 1 {
        series.values_per_point = series.values.len().max(1);
        return;
    }
    let points = time_range as f64 / series.step as f64;
    if (max_points as f64) < points {
        let per_point = (points / max_points as f64).ceil() as i64;
        let span = per_point * series.step;
        let nudge = span + series.start.rem_euclid(series.step) - series.start.rem_euclid(span);
        series.start += nudge;
        // graphite-web drops one value fewer than the nudge spans (its loop starts at 1).
        let lose = ((nudge / series.step) - 1).max(0) as usize;
        series.values.drain(..lose.min(series.values.len()));
        series.values_per_point = per_point as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(start: i64, step: i64, values: &[Option<f64>]) -> Series {
        let end = start + step * values.len() as i64;
        Series::new("s", start, end, step, values.to_vec())
    }

    #[test]
    fn consolidation_skips_nulls_and_keeps_the_short_last_chunk() {
        let mut s = series(0, 5, &[Some(1.0), None, Some(3.0), Some(4.0), None]);
        s.values_per_point = 2;
        assert_eq!(*s.points(), [Some(1.0), Some(3.5), None]);
        s.consolidation = "sum".into();
        assert_eq!(*s.points(), [Some(1.0), Some(7.0), None]);
        let (points, step) = s.timed_points();
        assert_eq!((points.len(), step), (3, 10), "times 0, 10, 20");
    }

    #[test]
    fn max_data_points_as_the_oracle_answers() {
        // mdp.5min_7: 60 points at 5 s from 1760000940, vpp 9, nudge 45, 8 values dropped.
        let values: Vec<Point> = (0..60).map(|i| Some(i as f64)).collect();
        let mut s = series(1760000940, 5, &values);
        fit(&mut s, 7, 300);
        assert_eq!(s.start, 1760000985);
        assert_eq!(s.values_per_point, 9);
        assert_eq!(s.values[0], Some(8.0));
        assert_eq!(s.points().len(), 6);
    }

    #[test]
    fn tags_of_a_new_series() {
        assert_eq!(
            Tags::of_name("api.calls;env=prod;region=eu").0,
            [("env", "prod"), ("region", "eu"), ("name", "api.calls")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(
            Tags::of_name("sumSeries(a.b)").get("name"),
            Some("sumSeries(a.b)")
        );
        assert_eq!(Tags::of_name("a;canary").get("name"), Some("a;canary"));
    }
}
