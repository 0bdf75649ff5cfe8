//! Everything Redis: the [`Store`] handle that owns how the agent reaches Redis (one server, a
//! master found through Sentinel, or a Redis Cluster), key names ([`keys`]), the flush script and
//! the [`Writer`] that applies flush chunks exactly once, the [`Cleaner`] that trims old slices,
//! and the [`Reader`] behind the CLI and the API.

pub mod bulk;
pub mod cleaner;
pub mod clock;
pub mod dump;
pub mod history;
pub mod keys;
pub mod quantile_blocks;
pub mod query;
pub mod reader;
pub mod rollup;
pub mod server;
mod write;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, Cmd, ConnectionAddr, ConnectionInfo,
    IntoConnectionInfo, Pipeline, TlsCertificates,
};

use crate::config::{Config, ConfigError, RedisMode, err};

pub use cleaner::Cleaner;
pub use keys::Keys;
pub use query::{Queries, QueryError, Schedule};
pub use reader::{QuantileRange, QuantilesView, Reader, SliceQuantiles, glob_match};
pub use write::{
    ChunkSettings, Chunker, CounterWrite, FlushChunk, GUARD_IDLE_SECS, InFlight, Numbering,
    Outcome, QuantileSettings, Writer, Written, build_chunks,
};
pub use write::{FollowUps, build_slot_chunks};

/// One connection from [`Store::connect`], made on first use and forgotten after a failure, so
/// the next use connects afresh (a multiplexed connection to a server that restarted stays
/// broken): the writer's, the cleaner's, the HTTP side's.
#[derive(Default)]
pub struct Cached(Option<Connection>);

impl Cached {
    /// The connection, made if there is none; `true` with one just made.
    pub async fn get(&mut self, store: &Store) -> Result<(Connection, bool), StoreError> {
        if let Some(c) = &self.0 {
            return Ok((c.clone(), false));
        }
        let c = store.connect().await?;
        self.0 = Some(c.clone());
        Ok((c, true))
    }

    /// Forgets the connection after a failure.
    pub fn forget(&mut self) {
        self.0 = None;
    }
}

/// A failed Redis call.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {0}{hint}", hint = acl_hint(&.0.to_string()))]
    Redis(#[from] redis::RedisError),
    #[error("redis: no answer within {0:?}")]
    Timeout(Duration),
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        StoreError::Redis(e.into())
    }
}

impl StoreError {
    /// Nothing listens where the agent looks for Redis (a fresh machine without one).
    pub fn no_redis_there(&self) -> bool {
        matches!(self, StoreError::Redis(e) if e.is_connection_refusal())
    }
}

/// What an error of Redis's ACL (`NOPERM`: a command or key the user may not touch) adds, else
/// nothing: where the agent's ACL is given.
pub fn acl_hint(error: &str) -> &'static str {
    if refused_by_acl(error) {
        " (the Redis user's ACL does not allow it: docs/operations.md, \"A Redis user of least privilege\", gives the ACL the agent needs)"
    } else {
        ""
    }
}

/// Whether Redis's error text is its ACL's refusal (`NOPERM`).
pub fn refused_by_acl(error: &str) -> bool {
    error.contains("no permissions to")
}

/// What the first warning of a connection refused adds: how to get a Redis.
pub const NO_REDIS_HINT: &str = "nothing answers at the Redis address: install Redis there (Debian: apt-get install -y redis-server) or point --redis (STATSD_REDIS_REDIS) at one";

/// How the agent reaches Redis, shared by the writer, the cleaner, the readers and `/readyz`:
/// every connection any of them opens comes from [`Store::connect`].
#[derive(Clone)]
pub struct Store {
    target: Arc<Target>,
    keys: Keys,
    timeout: Duration,
}

enum Target {
    Standalone(Client),
    /// Asked for the master at every connect, so a failover is followed on the next reconnect.
    Sentinel(tokio::sync::Mutex<SentinelClient>),
    Cluster(ClusterClient),
}

/// A connection from [`Store::connect`]: one server's, or a cluster's (which routes each command
/// by its first key and follows `MOVED` and `ASK`).
#[derive(Clone)]
pub enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

impl Connection {
    /// `command <key>` for each of `keys` (a key per slice: sets, quantile buckets): on one
    /// server in one pipeline, one round trip; in a cluster, where the keys live in any slot,
    /// all at once over clones of the connection.
    pub async fn each_key<T: redis::FromRedisValue>(
        &self,
        command: &str,
        keys: impl IntoIterator<Item = String>,
    ) -> Result<Vec<T>, StoreError> {
        if let Connection::Single(_) = self {
            let mut pipe = redis::pipe();
            for key in keys {
                pipe.cmd(command).arg(key);
            }
            if pipe.cmd_iter().next().is_none() {
                return Ok(Vec::new());
            }
            return Ok(pipe.query_async(&mut self.clone()).await?);
        }
        let calls = keys.into_iter().map(|key| {
            let mut conn = self.clone();
            let mut cmd = redis::cmd(command);
            cmd.arg(key);
            async move { cmd.query_async::<T>(&mut conn).await }
        });
        Ok(futures_util::future::try_join_all(calls).await?)
    }

    /// Keys matching `pattern`, found with `SCAN` (on every master of a cluster), each given
    /// to `take` until it answers `false` (enough) or about `examined` keys have been seen.
    /// Returns whether the whole key space was scanned.
    pub async fn scan_keys(
        &mut self,
        pattern: &str,
        examined: usize,
        mut take: impl FnMut(String) -> bool,
    ) -> Result<bool, StoreError> {
        let mut seen = 0;
        for node in self.masters().await? {
            let mut cursor = 0u64;
            loop {
                let (next, keys) = self.scan_page(&node, cursor, pattern).await?;
                seen += keys.len();
                for key in keys {
                    if !take(key) {
                        return Ok(false);
                    }
                }
                if next != 0 && seen >= examined {
                    return Ok(false);
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(true)
    }

    /// The servers whose keys `SCAN` walks: this one, or every master of a cluster (host and
    /// port).
    pub async fn masters(&mut self) -> Result<Vec<Option<(String, u16)>>, StoreError> {
        Ok(match self {
            Connection::Single(_) => vec![None],
            Connection::Cluster(c) => {
                // Each range: start, end, then its master as [host, port, id, ...], replicas.
                let ranges: Vec<Vec<redis::Value>> =
                    redis::cmd("CLUSTER").arg("SLOTS").query_async(c).await?;
                let mut masters: Vec<(String, u16)> = ranges
                    .iter()
                    .filter_map(|range| {
                        let node: Vec<redis::Value> =
                            redis::from_redis_value_ref(range.get(2)?).ok()?;
                        Some((
                            redis::from_redis_value_ref(node.first()?).ok()?,
                            redis::from_redis_value_ref(node.get(1)?).ok()?,
                        ))
                    })
                    .collect();
                masters.sort();
                masters.dedup();
                masters.into_iter().map(Some).collect()
            }
        })
    }

    /// One `SCAN` step on `node` (one of [`Connection::masters`]): the next cursor (0 at the
    /// end) and the keys matching `pattern`.
    pub async fn scan_page(
        &mut self,
        node: &Option<(String, u16)>,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>), StoreError> {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000);
        let reply = match (&mut *self, node) {
            (Connection::Cluster(c), Some((host, port))) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                c.route_command(scan, RoutingInfo::SingleNode(route))
                    .await?
            }
            (conn, _) => conn.req_packed_command(&scan).await?,
        };
        Ok(redis::from_redis_value(reply).map_err(redis::RedisError::from)?)
    }
}

/// Redirections a cluster call follows (a reshard answers `ASK`/`TRYAGAIN` while a slot moves,
/// a failover refuses calls for `cluster-node-timeout` and more).
const CLUSTER_RETRIES: u32 = 16;
/// The first wait before a retry; the crate's default (over a second) would stall every write
/// that meets a moving slot.
const CLUSTER_MIN_RETRY_WAIT_MS: u64 = 10;

impl Store {
    /// The handle for `config`'s `redis*` keys; a bad value is an error naming its key.
    pub fn open(config: &Config) -> Result<Store, ConfigError> {
        let bad = |key: &str, e: redis::RedisError| ConfigError {
            key: key.into(),
            message: match key {
                "redis" => url_problem(&config.redis).unwrap_or_else(|| e.to_string()),
                _ => e.to_string(),
            },
        };
        let timeout = Duration::from_millis(config.redis_timeout_ms);
        let url = config.redis.as_str();
        let certs = tls_certificates(config)?;
        let target = match config.redis_mode {
            RedisMode::Standalone => Target::Standalone(
                match &certs {
                    Some(certs) => Client::build_with_tls(url, certs.clone()),
                    None => Client::open(url),
                }
                .map_err(|e| bad("redis", e))?,
            ),
            RedisMode::Sentinel => {
                if config.redis_sentinels.is_empty() {
                    return Err(ConfigError {
                        key: "redis_sentinels".into(),
                        message: "sentinel mode needs at least one sentinel address".into(),
                    });
                }
                let client =
                    sentinel_client(config, certs.as_ref()).map_err(|(key, e)| bad(key, e))?;
                Target::Sentinel(tokio::sync::Mutex::new(client))
            }
            RedisMode::Cluster => {
                let (key, seeds) = if config.redis_cluster_nodes.is_empty() {
                    ("redis", vec![config.redis.clone()])
                } else {
                    (
                        "redis_cluster_nodes",
                        config
                            .redis_cluster_nodes
                            .iter()
                            .map(|a| with_scheme(a))
                            .collect(),
                    )
                };
                let mut builder = ClusterClient::builder(seeds);
                if let Some(certs) = certs {
                    builder = builder.certs(certs);
                }
                let client = builder
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(CLUSTER_RETRIES)
                    .min_retry_wait(CLUSTER_MIN_RETRY_WAIT_MS)
                    .max_retry_wait(timeout.as_millis() as u64)
                    .build()
                    .map_err(|e| bad(key, e))?;
                // Our key names put hash tags after these; a brace in them would move the tag.
                for (key, value) in [
                    ("key_prefix", &config.key_prefix),
                    ("agent_id", &config.agent_id),
                ] {
                    if value.contains(['{', '}']) {
                        return Err(ConfigError {
                            key: key.into(),
                            message: "in cluster mode it may not hold `{` or `}` (hash tags)"
                                .into(),
                        });
                    }
                }
                Target::Cluster(client)
            }
        };
        let keys = match config.redis_mode {
            RedisMode::Cluster => Keys::tagged(&config.key_prefix),
            _ => Keys::new(&config.key_prefix),
        };
        Ok(Store {
            target: Arc::new(target),
            keys,
            timeout,
        })
    }

    /// Whether `config`'s `redis*` keys make a store (nothing is connected).
    pub fn check(config: &Config) -> Result<(), ConfigError> {
        Store::open(config).map(drop)
    }

    /// Key names as this mode writes them.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Where [`bulk`] reads connect: one server without TLS (not Sentinel's, which moves, nor a
    /// cluster's).
    pub fn bulk_target(&self) -> Option<bulk::BulkTarget> {
        let Target::Standalone(client) = &*self.target else {
            return None;
        };
        let info = client.get_connection_info();
        let addr = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => bulk::BulkAddr::Tcp(host.clone(), *port),
            redis::ConnectionAddr::Unix(path) => bulk::BulkAddr::Unix(path.clone()),
            _ => return None,
        };
        let settings = info.redis_settings();
        Some(bulk::BulkTarget {
            addr,
            username: settings.username().map(String::from),
            password: settings.password().map(String::from),
            db: settings.db(),
            timeout: self.timeout,
        })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(*self.target, Target::Cluster(_))
    }

    /// A new connection whose connect and every call time out after the configured timeout.
    pub async fn connect(&self) -> Result<Connection, StoreError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let connecting = async {
            Ok::<_, StoreError>(match &*self.target {
                Target::Standalone(client) => Connection::Single(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?,
                ),
                Target::Sentinel(client) => Connection::Single(
                    client
                        .lock()
                        .await
                        .get_async_connection_with_config(&config)
                        .await?,
                ),
                Target::Cluster(client) => {
                    Connection::Cluster(client.get_async_connection().await?)
                }
            })
        };
        // Sentinel look-ups and a cluster's first topology read have no timeout of their own.
        let limit = self.timeout * 2;
        tokio::time::timeout(limit, connecting)
            .await
            .map_err(|_| StoreError::Timeout(limit))?
    }

    /// A reader over a new connection.
    pub async fn reader(&self) -> Result<Reader, StoreError> {
        Ok(Reader::new(self.connect().await?, self.keys.clone()))
    }

    /// `PING` over a fresh connection within `timeout`, for readiness checks (in a cluster,
    /// every master answers).
    pub async fn ping(&self, timeout: Duration) -> Result<(), StoreError> {
        let pinging = async {
            let mut conn = self.connect().await?;
            redis::cmd("PING").query_async::<()>(&mut conn).await?;
            Ok(())
        };
        tokio::time::timeout(timeout, pinging)
            .await
            .map_err(|_| StoreError::Timeout(timeout))?
    }
}

/// A Sentinel client: the sentinels of `redis_sentinels` (one password for all, the first
/// given; TLS for those written `rediss://`), the master named `redis_master_name`, reached
/// with the `redis` URL's user, password, database and TLS. An error names its key.
fn sentinel_client(
    config: &Config,
    certs: Option<&TlsCertificates>,
) -> Result<SentinelClient, (&'static str, redis::RedisError)> {
    let master = config
        .redis
        .as_str()
        .into_connection_info()
        .map_err(|e| ("redis", e))?;
    let sentinels = config
        .redis_sentinels
        .iter()
        .map(|a| with_scheme(a).into_connection_info())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ("redis_sentinels", e))?;
    let tls = |info: &ConnectionInfo| matches!(info.addr(), ConnectionAddr::TcpTls { .. });
    let mut builder = SentinelClientBuilder::new(
        sentinels.iter().map(|s| s.addr().clone()),
        &config.redis_master_name,
        SentinelServerType::Master,
    )
    .map_err(|e| ("redis_sentinels", e))?;
    let settings = master.redis_settings();
    builder = builder.set_client_to_redis_db(settings.db());
    if let Some(user) = settings.username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = settings.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    if tls(&master) {
        builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
        if let Some(certs) = certs {
            builder = builder.set_client_to_redis_certificates(certs.clone());
        }
    }
    if let Some(s) = sentinels
        .iter()
        .find(|s| s.redis_settings().password().is_some())
    {
        let settings = s.redis_settings();
        if let Some(user) = settings.username() {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
    }
    if sentinels.iter().any(tls) {
        builder = builder.set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
        if let Some(certs) = certs {
            builder = builder.set_client_to_sentinel_certificates(certs.clone());
        }
    }
    builder.build().map_err(|e| ("redis_sentinels", e))
}

/// The certificates of `redis_tls_ca_file`, `redis_tls_cert_file` and `redis_tls_key_file`,
/// read and checked here so that a bad file is an error naming its key (the client would only
/// fail every connect); `None` when none is set. A URL that asks to skip the certificate check
/// (`#insecure`) is refused: the CA file is the way to trust a private CA.
fn tls_certificates(config: &Config) -> Result<Option<TlsCertificates>, ConfigError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let urls = std::iter::once(("redis", &config.redis))
        .chain(
            config
                .redis_sentinels
                .iter()
                .map(|u| ("redis_sentinels", u)),
        )
        .chain(
            config
                .redis_cluster_nodes
                .iter()
                .map(|u| ("redis_cluster_nodes", u)),
        );
    for (key, url) in urls.clone() {
        if url.ends_with("#insecure") {
            return Err(err(
                key,
                "`#insecure` (TLS without checking the server's certificate) is not supported: \
                 give redis_tls_ca_file the CA that signed it",
            ));
        }
    }
    let read = |key: &str, path: &std::path::Path| -> Result<Option<Vec<u8>>, ConfigError> {
        if path.as_os_str().is_empty() {
            return Ok(None);
        }
        crate::config::read_file(path)
            .map(Some)
            .map_err(|e| err(key, format!("cannot read {}: {e}", path.display())))
    };
    let ca = read("redis_tls_ca_file", &config.redis_tls_ca_file)?;
    let cert = read("redis_tls_cert_file", &config.redis_tls_cert_file)?;
    let key = read("redis_tls_key_file", &config.redis_tls_key_file)?;
    for (name, pem) in [("redis_tls_ca_file", &ca), ("redis_tls_cert_file", &cert)] {
        if let Some(pem) = pem
            && CertificateDer::pem_slice_iter(pem)
                .next()
                .is_none_or(|c| c.is_err())
        {
            return Err(err(name, "holds no PEM certificate"));
        }
    }
    let private = key
        .as_ref()
        .map(|pem| {
            PrivateKeyDer::from_pem_slice(pem)
                .map_err(|_| err("redis_tls_key_file", "holds no PEM private key"))
        })
        .transpose()?;
    let client_tls = match (cert, key.zip(private)) {
        (Some(client_cert), Some((client_key, private))) => {
            // rustls checks that the key goes with the certificate only when a connection is
            // made: made here once, a mismatch stops the start instead of every connect.
            let chain = CertificateDer::pem_slice_iter(&client_cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| err("redis_tls_cert_file", e.to_string()))?;
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| err("redis_tls_cert_file", e.to_string()))?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_client_auth_cert(chain, private)
            .map_err(|e| {
                err(
                    "redis_tls_key_file",
                    format!("does not go with redis_tls_cert_file's certificate ({e})"),
                )
            })?;
            Some(ClientTlsConfig {
                client_cert,
                client_key,
            })
        }
        (None, None) => None,
        (Some(_), None) => {
            return Err(err(
                "redis_tls_key_file",
                "redis_tls_cert_file needs its key",
            ));
        }
        (None, Some(_)) => {
            return Err(err(
                "redis_tls_cert_file",
                "redis_tls_key_file needs its certificate",
            ));
        }
    };
    if ca.is_none() && client_tls.is_none() {
        return Ok(None);
    }
    if !urls
        .into_iter()
        .any(|(_, url)| url.starts_with("rediss://"))
    {
        let key = if ca.is_some() {
            "redis_tls_ca_file"
        } else {
            "redis_tls_cert_file"
        };
        return Err(err(key, "set, but no rediss:// URL uses TLS"));
    }
    Ok(Some(TlsCertificates {
        client_tls,
        root_cert: ca,
    }))
}

/// What is wrong with a Redis URL that the client refused, in words (the client says only
/// `InvalidClientConfig`); `None` when nothing obvious is.
fn url_problem(url: &str) -> Option<String> {
    let shown = crate::config::redacted(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(format!(
            "`{shown}` is not a URL: redis://host:port/db, rediss://… for TLS, redis+unix:///path"
        ));
    };
    if !["redis", "rediss", "redis+unix", "unix"].contains(&scheme) {
        return Some(format!(
            "`{shown}`: the scheme `{scheme}` is none of redis, rediss, redis+unix"
        ));
    }
    if scheme.ends_with("unix") {
        return None;
    }
    let authority = rest.split('/').next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    // A port after the last `:`, unless that `:` is inside an IPv6 address (`[::1]`).
    if let Some((_, port)) = host_port.rsplit_once(':')
        && !host_port.ends_with(']')
        && port.parse::<u16>().is_err()
    {
        return Some(format!(
            "`{shown}`: the port `{port}` is not a number from 1 to 65535"
        ));
    }
    if let Some(db) = rest
        .split_once('/')
        .map(|(_, db)| db)
        .filter(|db| !db.is_empty())
        && db.parse::<u32>().is_err()
    {
        return Some(format!("`{shown}`: the database `{db}` is not a number"));
    }
    None
}

/// `host:port` as a `redis://` URL; a URL as it is.
fn with_scheme(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_string()
    } else {
        format!("redis://{addr}")
    }
}

#[cfg(test)]
mod url_tests {
    use super::{Store, url_problem};
    use crate::config::Config;

    #[test]
    fn a_bad_redis_url_is_an_error_of_the_redis_key() {
        let config = Config {
            redis: "http://x".into(),
            ..Config::default()
        };
        assert_eq!(Store::check(&config).unwrap_err().key, "redis");
    }

    #[test]
    fn a_bad_redis_url_says_what_is_wrong() {
        let says = |url: &str, what: &str| {
            let problem = url_problem(url).unwrap_or_default();
            assert!(problem.contains(what), "{url}: {problem}");
        };
        says("nonsense", "is not a URL");
        says("http://h:6379/0", "the scheme `http`");
        says("redis://h:notaport/0", "the port `notaport`");
        says("redis://:pw@h:6379/zero", "the database `zero`");
        assert!(
            !url_problem("redis://:s3cret@h:x/0")
                .unwrap()
                .contains("s3cret")
        );
        for fine in [
            "redis://h:6379/0",
            "redis://[::1]:6379",
            "rediss://h",
            "redis+unix:///r.sock",
        ] {
            assert_eq!(url_problem(fine), None, "{fine}");
        }
    }
}
