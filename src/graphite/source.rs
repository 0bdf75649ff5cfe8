//! The agent's layout as Graphite sees it (docs/reading.md, "Grafana"): which series exist, the tree of
//! their dotted names, and each one's points at the precision whisper would choose.
//!
//! | type | Graphite name | a point |
//! |---|---|---|
//! | counter | `<name>` | the slice's count (`count:<p>:<name>`) |
//! | gauge | `<name>` | the slice's last value (`gauge:<p>:<name>`) |
//! | set | `<name>` | the slice's distinct members (`PFCOUNT set:<p>:<name>:<slice>`) |
//! | timer, histogram, distribution | `<name>.<stat>` (`count`, `sum`, `mean`, `min`, `max`, `p50`, `p75`, `p90`, `p95`, `p99`, `p999`) | from the slice's quantile buckets (`hist:<q>:<name>:<type>:<slice>`) |
//!
//! One name is one series: a counter wins over a gauge of the same name, a gauge over a set, a
//! set over a timer's statistic, a timer over a histogram over a distribution. Counters and
//! gauges are found through `known:` and `known:gauge:`, read by range (a prefix is a range;
//! the children of a node are found by skipping from one to the next); sets and timers have no
//! index and are found by a bounded `SCAN` (sets with a slice at the coarsest precision, timers
//! with statistics this hour or the last), remembered for [`NAMES_FOR`]. With
//! `graphite_etsy_names`, Etsy statsd's names of the same series too ([`super::etsy`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::GraphiteError;
use super::etsy::{self, Kind, Plan, View};
use super::names::{NodePattern, agent_name, graphite_name};
use super::series::{Point, Series};
use crate::aggregate::{Buckets, Mapping, StatKind};
use crate::config::Config;
use crate::retention::Retention;
use crate::storage_conf::Schemas;
use crate::store::bulk::{BulkPool, FEW_FIELDS, Hmget, LexRange, Members};
use crate::store::history::{self, Family};
use crate::store::quantile_blocks;
use crate::store::reader::{index_precisions, index_series, lex_range};
use crate::store::{Connection, Keys, Reader, StoreError, keys};

/// How long the names found by `SCAN` (sets, timers) are used before they are looked for again.
pub const NAMES_FOR: Duration = Duration::from_secs(30);
/// At most this many set and timer names are found (each kind), and at most this many keys
/// looked at for them: beyond, the tree misses some (they still render by name).
const SCANNED_NAMES: usize = 20_000;

/// The most globs whose series are kept at once ([`Remembered`]): past it, all are forgotten.
const REMEMBERED_GLOBS: usize = 1000;

/// The statistics of a timer, histogram or distribution, as the last node of their name.
pub const STATS: [&str; 11] = [
    "count", "sum", "mean", "min", "max", "p50", "p75", "p90", "p95", "p99", "p999",
];

/// A series found: its Graphite name, the agent's name, and its kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Leaf {
    pub path: String,
    pub series: String,
    pub kind: Kind,
    /// How its points show the series' (an Etsy name's view, `Plain` for the agent's own).
    pub view: View,
}

/// A node of the tree: its full dotted path, and whether a series ends there and whether
/// others go on below it.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub path: String,
    /// The series that ends here, if one does.
    pub leaf: Option<Leaf>,
    pub branch: bool,
}

/// A node of one kind's series (an Etsy namespace's): its path, the series of that kind that
/// ends there, whether others go on below.
#[derive(Clone)]
struct KindNode {
    path: String,
    leaf: Option<Leaf>,
    branch: bool,
}

/// A DogStatsD event or service check as Graphite's events show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub when: i64,
    pub what: String,
    pub name: String,
    pub severity: String,
}

/// Set and timer names found by `SCAN`: Graphite name and leaf, sorted by name.
type Names = Arc<Vec<(String, Leaf)>>;

/// A render's glob's series, with when they were found and the sizes of `known:` and
/// `known:gauge:` then.
type Glob = (Instant, (u64, u64), Arc<Vec<Leaf>>);

/// What the Graphite API finds by looking around and keeps for [`NAMES_FOR`]: the names
/// `SCAN` found, the precisions each index holds (found by skipping from one to the
/// next: a round trip each, which every `find` and render would otherwise pay), and the
/// series each render's glob named ([`Source::leaves`]).
#[derive(Default)]
pub struct Remembered {
    names: tokio::sync::Mutex<Option<(Instant, Names)>>,
    globs: tokio::sync::Mutex<HashMap<String, Glob>>,
    precisions: tokio::sync::Mutex<BTreeMap<String, (Instant, Vec<u64>)>>,
    /// The server's `hash-max-listpack-entries`: which hashes are listpacks.
    listpack_limit: tokio::sync::Mutex<Option<(Instant, u64)>>,
    /// Timer statistics read from packed quantile blocks, by the blocks' bytes.
    quantiles: quantile_blocks::Memo<Point>,
}

/// Index members read by the first call of a walk, and after each branch skipped.
const FIRST_BATCH: usize = 32;

/// Index members read by the first call of a walk of the last level, which a browse lists
/// whole (a level of a hundred leaves in one round trip).
const LAST_LEVEL_BATCH: usize = 128;

/// A prefix's children found by [`Source::children`]: node → (the series ending there: kind and
/// agent name; whether it is a branch).
type Children = BTreeMap<String, (Option<(Kind, String)>, bool)>;

/// Index members read per call at most while walking the tree.
const BATCH: usize = 1000;

/// Index members one `ZMSCORE` asks at most ([`Source::series_of`]).
const SCORES_A_CALL: usize = 1000;

/// What a [`Source::find`] is for: every node (a browse), or only the series (a render's
/// names, whose last literal node is then looked up, not walked).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    Nodes,
    Leaves,
}

/// Where a leaf's points come from over a range: the precision whisper's rule picks, the
/// range aligned to it, and its slices.
struct Window {
    step: i64,
    from: i64,
    until: i64,
    /// Shared by the leaves on the same grid (a render's mostly are).
    slices: Arc<[i64]>,
}

impl Window {
    /// The evaluation names its path expression ([`Series::new`] starts it as the name).
    fn series(&self, leaf: &Leaf, values: Vec<Point>) -> Series {
        Series::new(&leaf.path, self.from, self.until, self.step, values)
    }
}

/// A grid (first slice, end, step) and its slices.
type Grid = ((i64, i64, i64), Arc<[i64]>);

/// The distinct next nodes under `base` (`<precision>:<prefix>`) in an index (only `node`,
/// when given), read a batch at a time: leaf and branch flags per node. Tagged names are not
/// in the tree. Once a node is known to be a branch, the rest of its branch is skipped.
struct Walk<'a> {
    index: &'a str,
    base: &'a str,
    node: Option<&'a str>,
    from: Vec<u8>,
    end: Vec<u8>,
    size: usize,
    nodes: Vec<(String, bool, bool)>,
    done: bool,
}

impl<'a> Walk<'a> {
    /// A walk of the nodes under `base` that are `node`, or else start with `prefix`.
    fn new(
        index: &'a str,
        base: &'a str,
        (node, prefix): (Option<&'a str>, &str),
        first: usize,
    ) -> Walk<'a> {
        let (from, end) = match node {
            Some(node) => (
                [b"[", base.as_bytes(), node.as_bytes()].concat(),
                [b"(", base.as_bytes(), node.as_bytes(), b".\xff"].concat(),
            ),
            None => (
                [b"[", base.as_bytes(), prefix.as_bytes()].concat(),
                [b"(", base.as_bytes(), prefix.as_bytes(), b"\xff"].concat(),
            ),
        };
        Walk {
            index,
            base,
            node,
            from,
            end,
            size: first,
            nodes: Vec::new(),
            done: false,
        }
    }

    fn next_read(&self) -> LexRange<'_> {
        LexRange {
            key: self.index.as_bytes(),
            min: &self.from,
            max: &self.end,
            count: self.size,
        }
    }

    /// A batch read: small reads where a branch is skipped as soon as it is seen (a level of
    /// a few large branches), growing while a level is a run of leaves, or of small branches
    /// (`host<i>.load`), where skipping saves little.
    fn take(&mut self, batch: &Members) {
        let base = self.base.as_bytes();
        let mut skip_to = None;
        let before = self.nodes.len();
        for member in batch.iter() {
            let Some(rest) = member.get(base.len()..) else {
                continue;
            };
            if rest.contains(&b';') {
                continue;
            }
            let (name, branch) = match rest.iter().position(|&c| c == b'.') {
                Some(dot) => (&rest[..dot], true),
                None => (rest, false),
            };
            if self.node.is_some_and(|n| n.as_bytes() != name) {
                continue;
            }
            match self
                .nodes
                .last_mut()
                .filter(|(n, _, _)| n.as_bytes() == name)
            {
                Some(last) => {
                    last.1 |= !branch;
                    last.2 |= branch;
                }
                None => {
                    let name = String::from_utf8_lossy(name).into_owned();
                    self.nodes.push((name, !branch, branch))
                }
            }
            if branch {
                skip_to = Some([b"(", base, name, b".\xff"].concat());
            }
        }
        let Some(last) = batch.last().filter(|_| batch.len() == self.size) else {
            self.done = true;
            return;
        };
        // Past the last branch seen whole, or past the last member read.
        let past_last = [b"(", last].concat();
        // A node for every few members read (one more: the first may go on the last batch's):
        // skipping their branches saves little, a round trip each batch much.
        let small_branches = (self.nodes.len() - before + 1) * 4 >= batch.len();
        match skip_to.filter(|s| *s > past_last) {
            Some(skip) if !small_branches => {
                self.from = skip;
                self.size = FIRST_BATCH;
            }
            Some(skip) => {
                self.from = skip;
                self.size = (self.size * 4).min(BATCH);
            }
            None => {
                self.from = past_last;
                self.size = (self.size * 4).min(BATCH);
            }
        }
    }
}

pub struct Source<'a> {
    conn: Connection,
    /// The bulk reader for counters' and gauges' points and the index ranges, where the
    /// topology has one.
    bulk: Option<&'a BulkPool>,
    keys: &'a Keys,
    config: &'a Config,
    remembered: &'a Remembered,
    /// The slices of each grid leaves were read on in this request.
    grids: std::cell::RefCell<Vec<Grid>>,
    /// How long each precision is kept (`Config::retention`), read once a request.
    retention: std::cell::OnceCell<Retention>,
    /// Each series' own schema (`Config::schemas`), read once a request.
    schemas: std::cell::OnceCell<Schemas>,
}

impl<'a> Source<'a> {
    pub fn new(
        conn: Connection,
        keys: &'a Keys,
        config: &'a Config,
        remembered: &'a Remembered,
    ) -> Source<'a> {
        Source {
            conn,
            bulk: None,
            keys,
            config,
            remembered,
            grids: Default::default(),
            retention: Default::default(),
            schemas: Default::default(),
        }
    }

    /// A source over a clone of the (multiplexed) connection, for a read that runs beside
    /// others.
    pub fn clone_for_fetch(&self) -> Source<'a> {
        Source::new(self.conn.clone(), self.keys, self.config, self.remembered)
    }

    /// Reads counters' and gauges' points and the index ranges through `bulk`.
    pub fn with_bulk(mut self, bulk: &'a BulkPool) -> Source<'a> {
        self.bulk = Some(bulk);
        self
    }

    /// The DogStatsD events and service checks logged (`recent:`) between `from` and `until`
    /// (both included), oldest first: all of them, or those with every one of `tags` (a tag is
    /// the event's name or its severity). The 100 newest of each log are looked at.
    pub async fn events(
        &mut self,
        from: i64,
        until: i64,
        tags: &[String],
    ) -> Result<Vec<Event>, StoreError> {
        let mut reader = Reader::new(self.conn.clone(), self.keys.clone());
        let mut out = Vec::new();
        for (name, severity) in reader.log_names(super::MAX_SERIES).await? {
            if !tags.iter().all(|t| *t == name || *t == severity) {
                continue;
            }
            let log = reader.log(&name, &severity, 100).await?;
            for entry in log.recent {
                let Some((when, what)) = crate::store::clock::parse_asctime(&entry) else {
                    continue;
                };
                let when = when as i64;
                if (from..=until).contains(&when) {
                    out.push(Event {
                        when,
                        what: what.to_string(),
                        name: name.clone(),
                        severity: severity.clone(),
                    });
                }
            }
        }
        out.sort_by(|a, b| {
            (a.when, &a.what, &a.name, &a.severity).cmp(&(b.when, &b.what, &b.name, &b.severity))
        });
        Ok(out)
    }

    /// Set and timer names, graphite name → leaf, sorted by graphite name.
    async fn scanned(&mut self) -> Result<Arc<Vec<(String, Leaf)>>, StoreError> {
        let mut cache = self.remembered.names.lock().await;
        if let Some((at, names)) = cache.as_ref()
            && at.elapsed() < NAMES_FOR
        {
            return Ok(names.clone());
        }
        let mut reader = Reader::new(self.conn.clone(), self.keys.clone());
        let mut names: BTreeMap<String, Leaf> = BTreeMap::new();
        let coarsest = self.retention().precisions().into_iter().max().unwrap_or(1);
        let (sets, _) = reader
            .series_of(
                None,
                (coarsest, self.retention().history(coarsest).is_some()),
                None,
                SCANNED_NAMES,
            )
            .await?;
        for series in sets {
            names.entry(graphite_name(&series)).or_insert(Leaf {
                path: graphite_name(&series),
                series,
                kind: Kind::Set,
                view: View::Plain,
            });
        }
        // A timer that stopped is found from its packed quantile slices' blocks, at the
        // coarsest precision packed (kept longest).
        let packed = (self.config.quantile_precisions.iter().copied())
            .filter(|&p| self.retention().packs_quantiles(p))
            .max();
        for kind in StatKind::ALL {
            let (timers, _) = reader
                .series_of(
                    Some(kind),
                    (packed.unwrap_or(0), packed.is_some()),
                    None,
                    SCANNED_NAMES,
                )
                .await?;
            for series in timers {
                for stat in STATS {
                    let path = stat_path(&series, stat);
                    names.entry(path.clone()).or_insert(Leaf {
                        path,
                        series: series.clone(),
                        kind: Kind::Stat(kind, stat),
                        view: View::Plain,
                    });
                }
            }
        }
        let names = Arc::new(names.into_iter().collect::<Vec<_>>());
        *cache = Some((Instant::now(), names.clone()));
        Ok(names)
    }

    /// The nodes matching a dotted glob (`web.*.hits`, `{a,b}`, `[…]`, `?`), level by level, in
    /// name order; a tagged name (`name;k=v`) matches itself only.
    pub async fn find(&mut self, pattern: &str) -> Result<Vec<Node>, GraphiteError> {
        self.find_nodes(pattern, Want::Nodes).await
    }

    /// [`Source::find`], or only the nodes that are series ([`Want::Leaves`]).
    async fn find_nodes(&mut self, pattern: &str, want: Want) -> Result<Vec<Node>, GraphiteError> {
        if pattern.contains(';') {
            let found = self.exact(pattern).await?;
            return Ok(found
                .into_iter()
                .map(|l| Node {
                    path: l.path.clone(),
                    leaf: Some(l),
                    branch: false,
                })
                .collect());
        }
        let mut found = self.find_of(pattern, None, want).await?;
        let etsy = etsy::namespaces(self.config);
        if etsy.is_empty() {
            return Ok(found);
        }
        let parts = split_nodes(pattern);
        // A namespace's plans, and its tails', often ask for the same names.
        let mut kind_nodes: Vec<((String, Kind), Vec<KindNode>)> = Vec::new();
        for ns in &etsy {
            for plan in ns.plan(&parts).map_err(super::bad)? {
                // A namespace's own nodes are listed once it has a series, as carbon's
                // directories are made by the first file under them.
                let (pattern, tail, head) = match plan {
                    Plan::Branch(path) => ("*".to_string(), None, Some(path)),
                    Plan::Names { pattern, tail } => (pattern, tail, None),
                };
                let key = (pattern, ns.kind.clone());
                let at = match kind_nodes.iter().position(|(k, _)| *k == key) {
                    Some(at) => at,
                    None => {
                        let nodes = self.nodes_of(&key.0, &ns.kind, want).await?;
                        kind_nodes.push((key, nodes));
                        kind_nodes.len() - 1
                    }
                };
                if let Some(path) = head {
                    if !kind_nodes[at].1.is_empty() {
                        found.push(Node {
                            path,
                            leaf: None,
                            branch: true,
                        });
                    }
                    continue;
                }
                for node in kind_nodes[at].1.clone() {
                    let Some((tail, matched)) = tail else {
                        // The glob ends at the name: a leaf where the namespace has a tail
                        // of no nodes, else a branch (its tails below).
                        let bare = ns.tails.iter().find(|t| t.nodes.is_empty());
                        let path = ns.path(&node.path, &ns.tails[0], 0);
                        let named = node.leaf.is_some();
                        let leaf = node.leaf.zip(bare).map(|(leaf, tail)| Leaf {
                            path: path.clone(),
                            view: tail.view,
                            ..leaf
                        });
                        let branch = node.branch || (named && bare.is_none());
                        if leaf.is_some() || branch {
                            found.push(Node { path, leaf, branch });
                        }
                        continue;
                    };
                    let Some(leaf) = node.leaf else {
                        continue;
                    };
                    let path = ns.path(&node.path, tail, matched);
                    let whole = matched == tail.nodes.len();
                    found.push(Node {
                        leaf: whole.then(|| Leaf {
                            path: path.clone(),
                            view: tail.view,
                            kind: tail.kind_of(&leaf.kind),
                            ..leaf
                        }),
                        path,
                        branch: !whole,
                    });
                }
            }
        }
        // A path found twice (the agent's own name first) is one node.
        found.sort_by(|a, b| a.path.cmp(&b.path));
        let mut nodes: Vec<Node> = Vec::with_capacity(found.len());
        for n in found {
            match nodes.last_mut() {
                Some(last) if last.path == n.path => {
                    last.branch |= n.branch;
                    if last.leaf.is_none() {
                        last.leaf = n.leaf;
                    }
                }
                _ => nodes.push(n),
            }
        }
        Ok(nodes)
    }

    /// [`Source::find`] over the agent's own names, of one kind of series only when given.
    async fn find_of(
        &mut self,
        pattern: &str,
        only: Option<&Kind>,
        want: Want,
    ) -> Result<Vec<Node>, GraphiteError> {
        let parts: Vec<NodePattern> = split_nodes(pattern)
            .iter()
            .map(|p| NodePattern::new(p))
            .collect::<Result<_, _>>()
            .map_err(super::bad)?;
        let mut level: Vec<String> = vec![String::new()];
        let mut found = Vec::new();
        for (depth, part) in parts.iter().enumerate() {
            let last = depth + 1 == parts.len();
            // A literal node before the last is a prefix of the next level whether or not it
            // is there: the next level's ranges find nothing under one that is not.
            if let (false, Some(literal)) = (last, part.literal()) {
                level = level.iter().map(|p| format!("{p}{literal}.")).collect();
                continue;
            }
            // A render's last literal node (`servers.*.cpu.load`): only whether each name is a
            // series, asked of the indexes at once (not a walk of each name's range: a read a
            // name, index and precision).
            if let (true, Want::Leaves, Some(literal)) = (last, want, part.literal()) {
                let paths: Vec<String> = level.iter().map(|p| format!("{p}{literal}")).collect();
                let series = self.series_of(&paths, only).await?;
                for (path, series) in paths.into_iter().zip(series) {
                    if let Some((kind, series)) = series {
                        let leaf = Leaf {
                            path: path.clone(),
                            series,
                            kind,
                            view: View::Plain,
                        };
                        found.push(Node {
                            path,
                            leaf: Some(leaf),
                            branch: false,
                        });
                    }
                }
                break;
            }
            let mut next = Vec::new();
            let first = if last { LAST_LEVEL_BATCH } else { FIRST_BATCH };
            let all = self.children(&level, part, first, only).await?;
            for (prefix, children) in level.iter().zip(all) {
                for (child, (leaf, branch)) in children {
                    let path = format!("{prefix}{child}");
                    if last {
                        let leaf = leaf.map(|(kind, series)| Leaf {
                            path: path.clone(),
                            series,
                            kind,
                            view: View::Plain,
                        });
                        found.push(Node { path, leaf, branch });
                    } else if branch {
                        next.push(format!("{path}."));
                    }
                }
            }
            if next.len() > super::MAX_SERIES {
                return Err(super::bad(format!(
                    "the glob matches more than {} branches at its level {}, the limit: narrow it",
                    super::MAX_SERIES,
                    depth + 1
                )));
            }
            level = next;
        }
        found.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(found)
    }

    /// The series a path expression names: the leaves its glob matches, in name order (an
    /// exact name, tagged or not, is looked up directly).
    ///
    /// A glob's series are kept for [`NAMES_FOR`] while `known:` and `known:gauge:` hold as
    /// many members as when they were found (a `ZCARD` each, one round trip): a dashboard's
    /// refresh walks no tree, a new counter or gauge is named by the next render, and only a
    /// series gone while another came in its place is seen late, within [`NAMES_FOR`], as a
    /// new set or timer is (their names are [`Source::scanned`]'s, kept as long).
    pub async fn leaves(&mut self, pattern: &str) -> Result<Vec<Leaf>, GraphiteError> {
        if pattern.contains(';') || !pattern.contains(['*', '?', '[', '{']) {
            return Ok(self.exact(pattern).await?);
        }
        // At once (in a cluster the two indexes may be in different slots).
        let size = |index: String| {
            let mut conn = self.conn.clone();
            async move {
                redis::cmd("ZCARD")
                    .arg(index)
                    .query_async::<u64>(&mut conn)
                    .await
            }
        };
        // Refused (an ACL of an earlier release, without `ZCARD`): nothing is kept.
        let Ok(sizes) = futures_util::future::try_join(
            size(self.keys.counter_index().key),
            size(self.keys.gauge_index().key),
        )
        .await
        else {
            return self.glob_leaves(pattern).await;
        };
        if let Some((at, known, leaves)) = self.remembered.globs.lock().await.get(pattern)
            && at.elapsed() < NAMES_FOR
            && *known == sizes
        {
            return Ok(leaves.to_vec());
        }
        let leaves = self.glob_leaves(pattern).await?;
        let mut globs = self.remembered.globs.lock().await;
        if globs.len() >= REMEMBERED_GLOBS {
            globs.clear();
        }
        globs.insert(
            pattern.to_string(),
            (Instant::now(), sizes, Arc::new(leaves.clone())),
        );
        Ok(leaves)
    }

    /// A glob's series, found afresh.
    async fn glob_leaves(&mut self, pattern: &str) -> Result<Vec<Leaf>, GraphiteError> {
        let nodes = self.find_nodes(pattern, Want::Leaves).await?;
        Ok(nodes.into_iter().filter_map(|n| n.leaf).collect())
    }

    /// The series of one Graphite name, by precedence (counter, gauge, set, statistic), then
    /// as an Etsy name.
    pub async fn exact(&mut self, path: &str) -> Result<Vec<Leaf>, StoreError> {
        let found = self.exact_of(path, None).await?;
        if !found.is_empty() {
            return Ok(found);
        }
        for ns in etsy::namespaces(self.config) {
            let Some((name, tail)) = ns.name_of(path) else {
                continue;
            };
            let leaf = match ns.kind {
                Kind::Etsy(..) => {
                    let timers = self.timer_names().await?;
                    let series = graphite_name(&agent_name(&name));
                    timers
                        .binary_search_by(|(n, _)| n.cmp(&series))
                        .ok()
                        .map(|i| Leaf {
                            path: String::new(),
                            series: agent_name(&name),
                            kind: Kind::Etsy(timers[i].1, etsy::Field::Count),
                            view: View::Plain,
                        })
                }
                _ => self.exact_of(&name, Some(&ns.kind)).await?.pop(),
            };
            if let Some(leaf) = leaf {
                return Ok(vec![Leaf {
                    path: path.to_string(),
                    view: tail.view,
                    kind: tail.kind_of(&leaf.kind),
                    ..leaf
                }]);
            }
        }
        Ok(Vec::new())
    }

    /// The Graphite names of the timers, histograms and distributions `SCAN` found, and the
    /// kind of each (a timer over a histogram over a distribution of the same name, as
    /// [`Source::scanned`] keeps their statistics), sorted.
    async fn timer_names(&mut self) -> Result<Vec<(String, StatKind)>, StoreError> {
        let scanned = self.scanned().await?;
        let mut names: BTreeMap<String, StatKind> = BTreeMap::new();
        for (_, leaf) in scanned.iter() {
            if let Kind::Stat(kind, _) = leaf.kind {
                names.entry(graphite_name(&leaf.series)).or_insert(kind);
            }
        }
        Ok(names.into_iter().collect())
    }

    /// The nodes an Etsy namespace's glob of the agent's names finds among its kind's series:
    /// [`Source::find_of`]'s, or, for timers (whose names are branches of their statistics in
    /// the agent's tree), the timers' names matched here.
    async fn nodes_of(
        &mut self,
        pattern: &str,
        kind: &Kind,
        want: Want,
    ) -> Result<Vec<KindNode>, GraphiteError> {
        if let Kind::Etsy(..) = kind {
            let parts: Vec<NodePattern> = split_nodes(pattern)
                .iter()
                .map(|p| NodePattern::new(p))
                .collect::<Result<_, _>>()
                .map_err(super::bad)?;
            let mut nodes: BTreeMap<String, KindNode> = BTreeMap::new();
            for (name, stat) in self.timer_names().await? {
                if name.contains(';') {
                    continue;
                }
                let name_nodes: Vec<&str> = name.split('.').collect();
                if name_nodes.len() < parts.len()
                    || !parts.iter().zip(&name_nodes).all(|(p, n)| p.matches(n))
                {
                    continue;
                }
                let path = name_nodes[..parts.len()].join(".");
                let whole = name_nodes.len() == parts.len();
                let node = nodes.entry(path.clone()).or_insert(KindNode {
                    path,
                    leaf: None,
                    branch: false,
                });
                if whole {
                    node.leaf = Some(Leaf {
                        path: node.path.clone(),
                        series: agent_name(&name),
                        kind: Kind::Etsy(stat, etsy::Field::Count),
                        view: View::Plain,
                    });
                } else {
                    node.branch = true;
                }
            }
            return Ok(nodes.into_values().collect());
        }
        Ok(self
            .find_of(pattern, Some(kind), want)
            .await?
            .into_iter()
            .map(|n| KindNode {
                path: n.path,
                leaf: n.leaf.filter(|l| l.kind == *kind),
                branch: n.branch,
            })
            .collect())
    }

    /// [`Source::exact`] of the agent's own names, of one kind of series only when given.
    async fn exact_of(&mut self, path: &str, only: Option<&Kind>) -> Result<Vec<Leaf>, StoreError> {
        // A tagged name is known by its canonical form only, as carbon stores it.
        if graphite_name(path) != path {
            return Ok(Vec::new());
        }
        let series = agent_name(path);
        for (index, kind) in [
            (self.keys.counter_index(), Kind::Counter),
            (self.keys.gauge_index(), Kind::Gauge),
        ] {
            if only.is_some_and(|k| *k != kind) {
                continue;
            }
            let members: Vec<String> = self
                .retention()
                .archives()
                .iter()
                .map(|a| format!("{}:{series}", a.precision))
                .collect();
            let scores: Vec<Option<f64>> = redis::cmd("ZMSCORE")
                .arg(&index.key)
                .arg(&members)
                .query_async(&mut self.conn)
                .await?;
            if scores.iter().any(Option::is_some) {
                return Ok(vec![Leaf {
                    path: graphite_name(&series),
                    series,
                    kind,
                    view: View::Plain,
                }]);
            }
        }
        let scanned = self.scanned().await?;
        Ok(scanned_leaf(&scanned, &graphite_name(&series), only)
            .cloned()
            .into_iter()
            .collect())
    }

    /// Which of `paths` (untagged Graphite names) are series, of one kind only when given: the
    /// kind and agent name of each, by precedence (counter, gauge, then what `SCAN` found), as
    /// [`Source::children`] names a leaf. A `ZMSCORE` of every precision's member an index and
    /// [`SCORES_A_CALL`] members, in one pipeline.
    async fn series_of(
        &mut self,
        paths: &[String],
        only: Option<&Kind>,
    ) -> Result<Vec<Option<(Kind, String)>>, StoreError> {
        let mut found: Vec<Option<(Kind, String)>> = vec![None; paths.len()];
        for (index, kind) in [
            (self.keys.counter_index().key, Kind::Counter),
            (self.keys.gauge_index().key, Kind::Gauge),
        ] {
            if only.is_some_and(|k| *k != kind) {
                continue;
            }
            let precisions = self.precisions_in(&index).await?;
            let open: Vec<usize> = (0..paths.len()).filter(|&i| found[i].is_none()).collect();
            if open.is_empty() || precisions.is_empty() {
                continue;
            }
            let names_a_call = (SCORES_A_CALL / precisions.len()).max(1);
            let mut pipe = redis::pipe();
            for part in open.chunks(names_a_call) {
                let zmscore = pipe.cmd("ZMSCORE").arg(&index);
                for &i in part {
                    for p in &precisions {
                        zmscore.arg(keys::known_member(*p, &paths[i]));
                    }
                }
            }
            let replies: Vec<Vec<Option<f64>>> = pipe.query_async(&mut self.conn).await?;
            for (part, scores) in open.chunks(names_a_call).zip(replies) {
                for (&i, scores) in part.iter().zip(scores.chunks(precisions.len())) {
                    if scores.iter().any(Option::is_some) {
                        found[i] = Some((kind.clone(), agent_name(&paths[i])));
                    }
                }
            }
        }
        if found.iter().any(Option::is_none) {
            let scanned = self.scanned().await?;
            for (path, found) in paths.iter().zip(&mut found) {
                if found.is_some() {
                    continue;
                }
                *found = scanned_leaf(&scanned, path, only)
                    .map(|leaf| (leaf.kind.clone(), leaf.series.clone()));
            }
        }
        Ok(found)
    }

    /// The children of each of `prefixes` (`""` or a path ending in `.`) that `part` matches:
    /// the series that ends at each (kind and agent name, by precedence: counter, gauge, then
    /// what `SCAN` found), and whether it is a branch. Every prefix's index ranges are walked
    /// together, a round's reads in one pipeline, so that a level of many branches (`a.*.b`)
    /// costs the rounds of its longest walk, not a round trip a branch.
    async fn children(
        &mut self,
        prefixes: &[String],
        part: &NodePattern,
        first: usize,
        only: Option<&Kind>,
    ) -> Result<Vec<Children>, StoreError> {
        let add = |out: &mut Children, node: &str, leaf: Option<(Kind, String)>, branch: bool| {
            if part.matches(node) {
                let e = out.entry(node.to_string()).or_default();
                if e.0.is_none() {
                    e.0 = leaf;
                }
                e.1 |= branch;
            }
        };
        // Every precision's range of both indexes at once, for every prefix: in a cluster an
        // index is one key anyway.
        let mut ranges = Vec::new();
        for (index, kind) in [
            (self.keys.counter_index().key, Kind::Counter),
            (self.keys.gauge_index().key, Kind::Gauge),
        ] {
            if only.is_some_and(|k| *k != kind) {
                continue;
            }
            for p in self.precisions_in(&index).await? {
                for (i, prefix) in prefixes.iter().enumerate() {
                    ranges.push((i, index.clone(), kind.clone(), format!("{p}:{prefix}")));
                }
            }
        }
        let mut walks: Vec<Walk> = ranges
            .iter()
            .map(|(_, index, _, base)| {
                Walk::new(index, base, (part.literal(), part.prefix()), first)
            })
            .collect();
        // A round's reads at once, until every walk has reached the end of its range.
        loop {
            let going: Vec<&mut Walk> = walks.iter_mut().filter(|w| !w.done).collect();
            if going.is_empty() {
                break;
            }
            let requests: Vec<LexRange> = going.iter().map(|w| w.next_read()).collect();
            let batches = self.lex_ranges(&requests).await?;
            for (walk, batch) in going.into_iter().zip(batches) {
                walk.take(&batch);
            }
        }
        let mut out: Vec<Children> = vec![Children::new(); prefixes.len()];
        let walks = walks.into_iter().map(|w| w.nodes);
        // The same nodes come from every precision: each is named once.
        for ((i, _, kind, _), walk) in ranges.iter().zip(walks) {
            let (out, prefix) = (&mut out[*i], &prefixes[*i]);
            for (node, leaf, branch) in walk {
                if !part.matches(&node) {
                    continue;
                }
                let series = (leaf && out.get(&node).is_none_or(|e| e.0.is_none()))
                    .then(|| agent_name(&format!("{prefix}{node}")));
                let e = out.entry(node).or_default();
                if let Some(series) = series {
                    e.0 = Some((kind.clone(), series));
                }
                e.1 |= branch;
            }
        }
        let scanned = self.scanned().await?;
        for (out, prefix) in out.iter_mut().zip(prefixes) {
            let first = scanned.partition_point(|(name, _)| name.as_str() < prefix.as_str());
            for (name, leaf) in &scanned[first..] {
                let Some(rest) = name.strip_prefix(prefix.as_str()) else {
                    break;
                };
                if only.is_some_and(|k| *k != leaf.kind) {
                    continue;
                }
                if rest.contains(';') {
                    continue;
                }
                match rest.split_once('.') {
                    Some((node, _)) => add(out, node, None, true),
                    None => add(
                        out,
                        rest,
                        Some((leaf.kind.clone(), leaf.series.clone())),
                        false,
                    ),
                }
            }
        }
        Ok(out)
    }

    /// Each range's members: through the bulk reader in one pipeline where there is one,
    /// else each over a clone of the multiplexed connection, at once.
    async fn lex_ranges(&mut self, requests: &[LexRange<'_>]) -> Result<Vec<Members>, StoreError> {
        if let Some(bulk) = self.bulk.filter(|b| b.available()) {
            return bulk.lex_ranges(requests).await;
        }
        futures_util::future::try_join_all(requests.iter().map(|r| {
            let mut conn = self.conn.clone();
            async move {
                let key = String::from_utf8_lossy(r.key);
                let found = lex_range(&mut conn, &key, r.min, r.max, r.count).await?;
                let mut members = Members::default();
                for m in &found {
                    members.push(m.as_bytes());
                }
                Ok::<_, StoreError>(members)
            }
        }))
        .await
    }

    /// The precisions an index holds members of (kept for [`NAMES_FOR`]).
    async fn precisions_in(&mut self, index: &str) -> Result<Vec<u64>, StoreError> {
        if let Some((at, known)) = self.remembered.precisions.lock().await.get(index)
            && at.elapsed() < NAMES_FOR
        {
            return Ok(known.clone());
        }
        let found = index_precisions(&mut self.conn, index).await?;
        self.remembered
            .precisions
            .lock()
            .await
            .insert(index.to_string(), (Instant::now(), found.clone()));
        Ok(found)
    }

    /// Every series whose Graphite name starts with `prefix` (all when empty), counters and
    /// gauges from their indexes, sets and timers from what `SCAN` found: the tag database's
    /// candidates.
    pub async fn all_with_prefix(&mut self, prefix: &str) -> Result<Vec<Leaf>, StoreError> {
        let mut by_path: BTreeMap<String, Leaf> = BTreeMap::new();
        for (index, kind) in [
            (self.keys.counter_index().key, Kind::Counter),
            (self.keys.gauge_index().key, Kind::Gauge),
        ] {
            let mut series_seen: BTreeSet<String> = BTreeSet::new();
            for p in self.precisions_in(&index).await? {
                index_series(&mut self.conn, &index, p, prefix, |series| {
                    series_seen.insert(series.to_string());
                })
                .await?;
            }
            for series in series_seen {
                let path = graphite_name(&series);
                by_path.entry(path.clone()).or_insert(Leaf {
                    path,
                    series,
                    kind: kind.clone(),
                    view: View::Plain,
                });
            }
        }
        for (path, leaf) in self.scanned().await?.iter() {
            if path.starts_with(prefix) {
                by_path.entry(path.clone()).or_insert(leaf.clone());
            }
        }
        Ok(by_path.into_values().collect())
    }

    /// The points of each leaf between `from` and `until` as one whisper file with an archive
    /// per precision (each kept as long as its retention says) gives them: the finest archive that
    /// reaches back to `from` (from `now`), the slice holding `from` excluded and the one
    /// holding `until` included, null where nothing was written; in their order, a leaf whose
    /// retention the range lies wholly outside left out.
    ///
    /// Counters and gauges, with a bulk reader, in one pipeline of `HMGET`s whose replies are
    /// parsed as they arrive; the rest (and all of them without one) each over a clone of the
    /// multiplexed connection, at once, Redis answering one while the next is on its way.
    pub async fn fetch_all(
        &mut self,
        leaves: &[Leaf],
        from: i64,
        until: i64,
        now: i64,
    ) -> Result<Vec<Series>, StoreError> {
        let windows: Vec<Option<Window>> = leaves
            .iter()
            .map(|l| self.window(l, from, until, now))
            .collect();
        let mut blocks = self.blocks(leaves, &windows, now);
        let bulk = self.bulk.filter(|b| b.available());
        // The blocks' reads in the bulk reader's write, one transaction with the hashes' (a
        // slice the cleaner moves between the two would read twice); where it cannot take
        // them, each long archive's hash is read with its own blocks.
        let then = bulk.and_then(|_| blocks.bulk_commands(&self.conn));
        let mut values: Vec<Option<Vec<Point>>> = vec![None; leaves.len()];
        if then.is_none() {
            for i in blocks.with_hashes() {
                values[i] = windows[i].as_ref().map(|w| vec![None; w.slices.len()]);
            }
        }
        let mut answers = None;
        if let Some(bulk) = bulk {
            let hashes: Vec<(usize, String)> = leaves
                .iter()
                .zip(&windows)
                .enumerate()
                .filter(|(i, _)| values[*i].is_none())
                .filter_map(|(i, (leaf, w))| {
                    Some((i, self.hash_key(leaf, w.as_ref()?.step as u64)?))
                })
                .collect();
            let limit = self.listpack_limit().await?;
            let retention = self.retention();
            let requests: Vec<Hmget> = hashes
                .iter()
                .map(|(i, key)| {
                    let (step, fields) = windows[*i]
                        .as_ref()
                        .map_or((0, &[][..]), |w| (w.step as u64, &w.slices[..]));
                    Hmget {
                        key: key.as_bytes(),
                        fields,
                        // A long archive's hash holds its newest slices only (the rest are
                        // in blocks): read whole, it is short.
                        whole: fields.len() > FEW_FIELDS
                            && (retention.samples(step) < limit
                                || retention.history(step).is_some()),
                    }
                })
                .collect();
            if !requests.is_empty() || then.is_some() {
                let (read, blocks_read) = bulk.hmget_then(&requests, then.as_ref()).await?;
                for ((i, _), v) in hashes.iter().zip(read) {
                    values[*i] = Some(v);
                }
                answers = blocks_read;
            }
        }
        let rest = futures_util::future::try_join_all(
            leaves
                .iter()
                .zip(&windows)
                .zip(&values)
                .filter(|((_, w), v)| w.is_some() && v.is_none())
                .map(|((leaf, w), _)| {
                    let mut source = self.clone_for_fetch();
                    let (step, slices) = w
                        .as_ref()
                        .map_or((0, &[][..]), |w| (w.step as u64, &w.slices[..]));
                    async move { source.points(leaf, step, slices, now).await }
                }),
        )
        .await?;
        let mut rest = rest.into_iter();
        let mut values: Vec<Vec<Point>> = windows
            .iter()
            .zip(values)
            .map(|(w, v)| match (w, v) {
                (None, _) => Vec::new(),
                (Some(_), Some(v)) => v,
                (Some(_), None) => rest.next().unwrap_or_default(),
            })
            .collect();
        let hashes = blocks
            .add(&self.conn, self.bulk, answers, &mut values)
            .await?;
        for (i, family, reply) in hashes {
            let (Some(w), Some(v)) = (&windows[i], values.get_mut(i)) else {
                continue;
            };
            let held: BTreeMap<String, String> =
                redis::from_redis_value(reply).map_err(redis::RedisError::from)?;
            for (value, held) in v.iter_mut().zip(held_points(&held, &w.slices)) {
                if let Some(held) = held {
                    *value = Some(value.map_or(held, |block| family.combine(held, block)));
                }
            }
        }
        let mut out = Vec::with_capacity(leaves.len());
        for ((leaf, w), mut v) in leaves.iter().zip(windows).zip(values) {
            let Some(w) = w else { continue };
            leaf.view.apply(
                &mut v,
                w.step,
                &w.slices,
                now - self.write_lag(leaf, w.step),
            );
            out.push(w.series(leaf, v));
        }
        Ok(out)
    }

    /// The block reads of each counter's, gauge's and set's long archive over its window
    /// (`store::history`) as of `now`, their values the leaf's.
    fn blocks<'w>(
        &self,
        leaves: &[Leaf],
        windows: &'w [Option<Window>],
        now: i64,
    ) -> history::Blocks<'w> {
        let keys = self.keys;
        let asked: Vec<history::Asked> = leaves
            .iter()
            .zip(windows)
            .enumerate()
            .filter_map(|(i, (leaf, w))| {
                let w = w.as_ref()?;
                let step = w.step as u64;
                let cut = self.retention().history(step)?;
                let (name, family) = match leaf.kind {
                    Kind::Gauge => (self.hash_key(leaf, step)?, Family::Gauge),
                    Kind::Set => (keys.set_series(step, &leaf.series), Family::Set),
                    _ => (self.hash_key(leaf, step)?, Family::Counter),
                };
                Some(history::Asked {
                    name,
                    precision: step,
                    cut,
                    slices: &w.slices,
                    family,
                    values: i,
                    with_hash: false,
                })
            })
            .collect();
        history::Blocks::plan(keys, now.max(0) as u64, asked)
    }

    /// How long after its end a slice of `leaf`'s at `step` seconds is written: a window's
    /// second, and the quantile buckets' or the coarse counters' deferred writes.
    fn write_lag(&self, leaf: &Leaf, step: i64) -> i64 {
        let c = self.config;
        let deferred = match leaf.kind {
            Kind::Stat(..) | Kind::Etsy(..) => c.quantile_write_secs,
            Kind::Counter if c.coarse_write_secs() > 0 && step as u64 > c.flush_interval_secs => {
                c.coarse_write_secs().min(step as u64)
            }
            _ => 0,
        };
        (c.flush_interval_secs + deferred) as i64
    }

    /// What [`Source::fetch_all`] would give, with every value null, read from nothing.
    pub fn shapes(&self, leaves: &[Leaf], from: i64, until: i64, now: i64) -> Vec<Series> {
        leaves
            .iter()
            .filter_map(|leaf| {
                let w = self.window(leaf, from, until, now)?;
                let values = vec![None; w.slices.len()];
                Some(w.series(leaf, values))
            })
            .collect()
    }

    /// The start, end and number of points [`Source::fetch_all`] would give `leaf`, without
    /// reading them; `None` when it would give no series.
    pub fn grid(&self, leaf: &Leaf, from: i64, until: i64, now: i64) -> Option<(i64, i64, usize)> {
        let w = self.window(leaf, from, until, now)?;
        Some((w.from, w.until, w.slices.len()))
    }

    /// The hash a counter's or a gauge's points at `step` are in.
    fn hash_key(&self, leaf: &Leaf, step: u64) -> Option<String> {
        match leaf.kind {
            Kind::Counter => Some(self.keys.counter(step, &leaf.series)),
            Kind::Gauge => Some(self.keys.gauge(step, &leaf.series)),
            _ => None,
        }
    }

    /// Whisper's choice of archive and slices for `leaf` over the range, by the archives of
    /// its Graphite name's own schema (`storage_schemas`, as carbon gives each file its own);
    /// `None` when the range lies wholly outside its retention.
    fn window(&self, leaf: &Leaf, from: i64, until: i64, now: i64) -> Option<Window> {
        let retention = self
            .schemas
            .get_or_init(|| self.config.schemas())
            .of(&leaf.path);
        let mut archives: Vec<(i64, i64)> = match leaf.kind {
            Kind::Stat(..) | Kind::Etsy(..) => self.config.quantile_precisions.clone(),
            _ => retention.precisions(),
        }
        .into_iter()
        .map(|p| (p as i64, retention.seconds(p) as i64))
        .collect();
        archives.sort_unstable();
        // whisper's file_fetch: the range clamped to the longest retention, then the first
        // archive (finest first) that reaches back to `from`, else the last.
        let max_retention = archives.iter().map(|a| a.1).max()?;
        if from > now || until < now - max_retention {
            return None;
        }
        let from = from.max(now - max_retention);
        let until = until.min(now);
        let (step, _) = *archives
            .iter()
            .find(|(_, kept)| *kept >= now - from)
            .or(archives.last())?;
        let from_i = from - from.rem_euclid(step) + step;
        let mut until_i = until - until.rem_euclid(step) + step;
        if from_i == until_i {
            until_i += step;
        }
        let mut grids = self.grids.borrow_mut();
        let slices = match grids.iter().find(|(k, _)| *k == (from_i, until_i, step)) {
            Some((_, slices)) => slices.clone(),
            None => {
                let slices: Arc<[i64]> = (0..)
                    .map(|i| from_i + i * step)
                    .take_while(|t| *t < until_i)
                    .collect();
                grids.push(((from_i, until_i, step), slices.clone()));
                slices
            }
        };
        Some(Window {
            step,
            from: from_i,
            until: until_i,
            slices,
        })
    }

    /// The server's `hash-max-listpack-entries` (`hash-max-ziplist-entries` before Redis 7),
    /// asked once a minute; Redis's default, 512, when `CONFIG GET` is refused.
    async fn listpack_limit(&mut self) -> Result<u64, StoreError> {
        let mut remembered = self.remembered.listpack_limit.lock().await;
        if let Some((at, limit)) = *remembered
            && at.elapsed() < NAMES_FOR
        {
            return Ok(limit);
        }
        let limit = crate::store::server::listpack_entries(&mut self.conn)
            .await?
            .map_or(512, |(_, n)| n);
        *remembered = Some((Instant::now(), limit));
        Ok(limit)
    }

    /// How long each precision is kept.
    fn retention(&self) -> &Retention {
        self.retention.get_or_init(|| self.config.retention())
    }

    /// `leaf`'s points at `step` for `slices`, as of `now`: of a long archive, the hash's (or
    /// the sets' HyperLogLogs') part; the blocks' are added by [`Source::blocks`]' reads.
    async fn points(
        &mut self,
        leaf: &Leaf,
        step: u64,
        slices: &[i64],
        now: i64,
    ) -> Result<Vec<Point>, StoreError> {
        let keys = self.keys;
        match &leaf.kind {
            Kind::Counter | Kind::Gauge => {
                let key = self.hash_key(leaf, step).unwrap_or_default();
                if slices.is_empty() {
                    return Ok(Vec::new());
                }
                if self.retention().history(step).is_some() {
                    // The newest slices only (the rest are in blocks): read whole, it is short.
                    let held: BTreeMap<String, String> = redis::cmd("HGETALL")
                        .arg(key)
                        .query_async(&mut self.conn)
                        .await?;
                    return Ok(held_points(&held, slices));
                }
                let values: Vec<redis::Value> = redis::cmd("HMGET")
                    .arg(key)
                    .arg(slices)
                    .query_async(&mut self.conn)
                    .await?;
                Ok(values.iter().map(number).collect())
            }
            Kind::Set => {
                // Of a long archive, the slices the cleaner has surely moved are in the blocks.
                let from = match self.retention().history(step) {
                    Some(_) => history::set_keys_from(
                        now.max(0) as u64,
                        step,
                        self.config.cleaner_interval_secs,
                    ) as i64,
                    _ => i64::MIN,
                };
                let skipped = slices.partition_point(|s| *s < from);
                let counts: Vec<u64> = self
                    .conn
                    .each_key(
                        "PFCOUNT",
                        slices[skipped..]
                            .iter()
                            .map(|s| keys.set(step, &leaf.series, *s as u64)),
                    )
                    .await?;
                // A slice without members has no key: null, as a counter's missing slice.
                Ok(std::iter::repeat_n(None, skipped)
                    .chain(counts.into_iter().map(|n| (n > 0).then_some(n as f64)))
                    .collect())
            }
            Kind::Stat(kind, _) | Kind::Etsy(kind, _) => {
                let hashes_from = quantile_blocks::hashes_from(
                    self.retention(),
                    now.max(0) as u64,
                    step,
                    self.config.cleaner_interval_secs,
                );
                let slices: Vec<u64> = slices.iter().map(|s| *s as u64).collect();
                let (statistic, name) = match &leaf.kind {
                    Kind::Stat(_, stat) => (Statistic::parse(stat), format!("stat {stat}")),
                    Kind::Etsy(_, field) => (None, format!("etsy {field:?}")),
                    _ => (None, String::new()),
                };
                let read = quantile_blocks::read(
                    &self.conn,
                    keys,
                    (&leaf.series, *kind, step),
                    &slices,
                    hashes_from,
                    Some((&self.remembered.quantiles, &name)),
                    |mapping, buckets| match (&leaf.kind, &statistic) {
                        (Kind::Etsy(_, field), _) => field.of(buckets, mapping),
                        (_, Some(statistic)) => statistic.of(buckets, mapping),
                        _ => None,
                    },
                )
                .await?;
                Ok(read.into_iter().map(Option::flatten).collect())
            }
        }
    }
}

/// The set or timer statistic `SCAN` found under Graphite name `path`, of kind `only` when
/// given.
fn scanned_leaf<'n>(scanned: &'n Names, path: &str, only: Option<&Kind>) -> Option<&'n Leaf> {
    scanned
        .binary_search_by(|(name, _)| name.as_str().cmp(path))
        .ok()
        .map(|at| &scanned[at].1)
        .filter(|leaf| only.is_none_or(|k| *k == leaf.kind))
}

/// A hash's fields (`HGETALL`'s) at `slices`, null where it has none.
fn held_points(held: &BTreeMap<String, String>, slices: &[i64]) -> Vec<Point> {
    let held: BTreeMap<i64, f64> = held
        .iter()
        .filter_map(|(s, v)| Some((s.parse().ok()?, v.parse().ok()?)))
        .collect();
    slices.iter().map(|s| held.get(s).copied()).collect()
}

/// A stored value as a number: a count's digits read directly (a render reads thousands), any
/// other text as a float; `None` for a missing field or text that is no number.
fn number(v: &redis::Value) -> Point {
    match v {
        redis::Value::BulkString(bytes) => crate::store::bulk::number(bytes),
        _ => None,
    }
}

/// A timer statistic's Graphite name: `<metric>.<stat>`, its tags after.
fn stat_path(series: &str, stat: &str) -> String {
    let name = graphite_name(series);
    match name.split_once(';') {
        Some((metric, tags)) => format!("{metric}.{stat};{tags}"),
        None => format!("{name}.{stat}"),
    }
}

/// A timer statistic's name, read once for all of a render's slices.
enum Statistic {
    Count,
    Sum,
    Mean,
    Quantile(f64),
}

impl Statistic {
    /// `count`, `sum`, `mean`, `min`, `max` or `p<digits>` (`p99`: 0.99, `p999`: 0.999).
    fn parse(stat: &str) -> Option<Statistic> {
        Some(match stat {
            "count" => Statistic::Count,
            "sum" => Statistic::Sum,
            "mean" => Statistic::Mean,
            "min" => Statistic::Quantile(0.0),
            "max" => Statistic::Quantile(1.0),
            p => Statistic::Quantile(format!("0.{}", p.strip_prefix('p')?).parse().ok()?),
        })
    }

    /// This statistic of a slice's quantile buckets: the count (weights summed), the sum and
    /// mean (each bucket at its estimate), the extremes (the first and last bucket's
    /// estimates) and quantiles, each within the buckets' accuracy; null for a slice without
    /// values.
    fn of(&self, buckets: &Buckets, mapping: &Mapping) -> Point {
        let total = || buckets.total();
        let sum = || {
            buckets
                .iter()
                .map(|(b, w)| mapping.value(b) * w)
                .sum::<f64>()
        };
        match self {
            Statistic::Quantile(q) => buckets.quantile(mapping, *q),
            _ if total() <= 0.0 => None,
            Statistic::Count => Some(total()),
            Statistic::Sum => Some(sum()),
            Statistic::Mean => Some(sum() / total()),
        }
    }
}

/// A glob's nodes, split at the dots outside `{…}`.
pub fn split_nodes(pattern: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut depth = 0;
    for c in pattern.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            '.' if depth == 0 => {
                out.push(String::new());
                continue;
            }
            _ => {}
        }
        out.last_mut().expect("one").push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_statistics_are_nodes_under_the_timer() {
        assert_eq!(stat_path("api.latency", "p99"), "api.latency.p99");
        assert_eq!(
            stat_path("api.latency;region=eu;env=prod", "count"),
            "api.latency.count;env=prod;region=eu"
        );
        assert_eq!(split_nodes("web.{a,b}.x"), ["web", "{a,b}", "x"]);
    }

    #[test]
    fn stored_values_read_as_numbers() {
        let v = |t: &str| number(&redis::Value::BulkString(t.as_bytes().to_vec()));
        assert_eq!(v("42"), Some(42.0));
        assert_eq!(v("-7"), Some(-7.0));
        assert_eq!(v("10.25"), Some(10.25));
        assert_eq!(v("0.30000000000000004"), Some(0.1 + 0.2));
        assert_eq!(v("99999999999999999999"), Some(1e20));
        assert_eq!(v("x"), None);
        assert_eq!(v("-"), None);
        assert_eq!(number(&redis::Value::Nil), None);
    }
}
