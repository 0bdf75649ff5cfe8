//! Basic authentication as exporter-toolkit does it (`basic_auth_users`): [`Users::check`]
//! takes a request's `Authorization` header and says whether it names a user with the right
//! password; [`unauthorized`] is the toolkit's 401.
//!
//! bcrypt is slow on purpose (about 60 ms at cost 10, docs/benchmarks.md), so:
//! * it runs on the HTTP runtime's blocking threads, one hash at a time ([`BCRYPT_AT_ONCE`]):
//!   never on the threads that serve requests, nor on the agent's, which read and flush;
//! * each answer is kept, under a SHA-256 of the user, the stored hash and the password, each
//!   but the last preceded by its length: two different triples never share a key (the
//!   toolkit's CVE-2022-46146 was a key made by plain concatenation). A right password is hashed
//!   once per configuration, and a flood of wrong ones never pushes it out ([`Cache`]);
//! * an unknown user is checked against a configured user's hash, forced false: it costs what
//!   a known one costs, so the time of a 401 does not say which users exist.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;

use crate::telemetry::AuthFailure;

/// bcrypt hashes computed at once: one core's worth, the toolkit's choice too (it holds a
/// mutex around each). On a two-core machine the other core keeps reading and flushing.
pub const BCRYPT_AT_ONCE: usize = 1;

/// How long a request waits for its turn at bcrypt before it is told the server is busy (503):
/// under a flood of new passwords the queue is long, and a right password already verified
/// never waits in it.
const BCRYPT_WAIT: Duration = Duration::from_secs(5);

/// Answers kept: right ones up to this many (a user has one password; more means several
/// 72-byte-equal ones or many users), wrong ones up to eight times as many. A full set is
/// emptied, so an attacker's passwords only ever evict each other.
const CACHED_RIGHT: usize = 1024;
const CACHED_WRONG: usize = 8 * CACHED_RIGHT;

/// The users of a web configuration file, with their cache of answers.
#[derive(Debug)]
pub struct Users {
    hashes: HashMap<String, String>,
    /// The hash an unknown user's password is checked against: a configured user's, of the
    /// cost most of them have.
    dummy: String,
    cache: Cache,
    turns: Arc<tokio::sync::Semaphore>,
}

#[derive(Debug, Default)]
struct Cache {
    right: Mutex<HashSet<[u8; 32]>>,
    wrong: Mutex<HashSet<[u8; 32]>>,
}

impl Cache {
    fn get(&self, key: &[u8; 32]) -> Option<bool> {
        let lock = |m: &Mutex<HashSet<[u8; 32]>>| {
            m.lock().unwrap_or_else(|p| p.into_inner()).contains(key)
        };
        if lock(&self.right) {
            Some(true)
        } else if lock(&self.wrong) {
            Some(false)
        } else {
            None
        }
    }

    fn put(&self, key: [u8; 32], right: bool) {
        let (set, bound) = match right {
            true => (&self.right, CACHED_RIGHT),
            false => (&self.wrong, CACHED_WRONG),
        };
        let mut set = set.lock().unwrap_or_else(|p| p.into_inner());
        if set.len() >= bound {
            set.clear();
        }
        set.insert(key);
    }
}

/// The cost of a bcrypt hash as `htpasswd -B` writes it (`$2y$`, and `$2a$`, `$2b$`), or why it
/// is not one.
fn bcrypt_cost(hash: &str) -> Result<u32, String> {
    let prefix = hash.get(..4).unwrap_or_default();
    if !matches!(prefix, "$2a$" | "$2b$" | "$2y$") {
        return Err("not a bcrypt hash: it must start with $2a$, $2b$ or $2y$".into());
    }
    let parts: bcrypt::HashParts = hash
        .parse()
        .map_err(|e| format!("not a bcrypt hash: {e}"))?;
    match parts.get_cost() {
        cost @ 4..=31 => Ok(cost),
        cost => Err(format!("bcrypt cost {cost} is outside 4 to 31")),
    }
}

/// The key of an answer: user, stored hash and password, length-prefixed, hashed.
fn cache_key(user: &str, stored: &str, password: &[u8]) -> [u8; 32] {
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [user.as_bytes(), stored.as_bytes()] {
        digest.update(&(part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    digest.update(password);
    digest.finish().as_ref().try_into().unwrap_or([0; 32])
}

/// A request's `Basic` credentials: Go's `Request.BasicAuth` (the scheme in any case, standard
/// base64, the user up to the first colon).
pub fn basic_credentials(value: &HeaderValue) -> Option<(String, Vec<u8>)> {
    let value = value.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((user, decoded[colon + 1..].to_vec()))
}

impl Users {
    /// The users of a file; each hash must be bcrypt's.
    pub fn new(users: Vec<(String, String)>) -> Result<Users, String> {
        let mut costs: HashMap<u32, (usize, &str)> = HashMap::new();
        for (user, hash) in &users {
            let cost = bcrypt_cost(hash)
                .map_err(|e| format!("basic_auth_users: the hash of {user:?} is {e}"))?;
            costs.entry(cost).or_insert((0, hash)).0 += 1;
        }
        let dummy = costs
            .values()
            .max_by_key(|(n, _)| *n)
            .map(|(_, hash)| hash.to_string())
            .unwrap_or_default();
        Ok(Users {
            hashes: users.into_iter().collect(),
            dummy,
            cache: Cache::default(),
            turns: Arc::new(tokio::sync::Semaphore::new(BCRYPT_AT_ONCE)),
        })
    }

    /// Whether `authorization` (the request's header) names a user with the right password.
    pub async fn check(&self, authorization: Option<&HeaderValue>) -> Result<(), AuthFailure> {
        let (user, password) = authorization
            .and_then(basic_credentials)
            .ok_or(AuthFailure::Missing)?;
        let (known, stored) = match self.hashes.get(&user) {
            Some(hash) => (true, hash.as_str()),
            None => (false, self.dummy.as_str()),
        };
        let failure = match known {
            true => AuthFailure::WrongPassword,
            false => AuthFailure::UnknownUser,
        };
        let key = cache_key(&user, stored, &password);
        let right = match self.cache.get(&key) {
            Some(right) => right,
            None => {
                let turn = tokio::time::timeout(BCRYPT_WAIT, self.turns.clone().acquire_owned());
                let Ok(Ok(turn)) = turn.await else {
                    return Err(AuthFailure::Busy);
                };
                let stored = stored.to_string();
                let verified = tokio::task::spawn_blocking(move || {
                    let right = bcrypt::verify(&password, &stored).unwrap_or(false);
                    drop(turn);
                    right
                })
                .await
                .unwrap_or(false);
                let right = known && verified;
                self.cache.put(key, right);
                right
            }
        };
        match known && right {
            true => Ok(()),
            false => Err(failure),
        }
    }
}

/// The toolkit's answer to a request without the right user: 401 with `WWW-Authenticate:
/// Basic` (no realm), Go's `http.Error` body and headers; 503 when bcrypt is too busy to tell.
pub fn unauthorized(failure: AuthFailure) -> Response {
    let (status, body) = match failure {
        AuthFailure::Busy => (StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable\n"),
        _ => (StatusCode::UNAUTHORIZED, "Unauthorized\n"),
    };
    let mut response = (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(user: &str, password: &str) -> HeaderValue {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        HeaderValue::from_str(&format!("Basic {encoded}")).unwrap()
    }

    fn users() -> Users {
        let alice = bcrypt::hash("alice123", 4).unwrap();
        let bob = bcrypt::hash("bob123", 4)
            .unwrap()
            .replacen("$2b$", "$2y$", 1);
        Users::new(vec![("alice".into(), alice), ("bob".into(), bob)]).unwrap()
    }

    #[tokio::test]
    async fn right_and_wrong_users() {
        let users = users();
        assert_eq!(users.check(Some(&basic("alice", "alice123"))).await, Ok(()));
        assert_eq!(
            users.check(Some(&basic("bob", "bob123"))).await,
            Ok(()),
            "$2y$"
        );
        assert_eq!(
            users.check(Some(&basic("alice", "bob123"))).await,
            Err(AuthFailure::WrongPassword)
        );
        assert_eq!(
            users.check(Some(&basic("carol", "alice123"))).await,
            Err(AuthFailure::UnknownUser),
            "a known user's password under an unknown name"
        );
        assert_eq!(users.check(None).await, Err(AuthFailure::Missing));
        let bad = ["Bearer x", "Basic !!!", "Basic", "Basic YWxpY2U="];
        for header in bad {
            assert_eq!(
                users.check(Some(&HeaderValue::from_static(header))).await,
                Err(AuthFailure::Missing),
                "{header}"
            );
        }
        // Go's BasicAuth takes the scheme in any case.
        let lower = basic("alice", "alice123")
            .to_str()
            .unwrap()
            .replace("Basic", "bAsIc");
        assert_eq!(
            users
                .check(Some(&HeaderValue::from_str(&lower).unwrap()))
                .await,
            Ok(())
        );
    }

    /// CVE-2022-46146: with concatenated parts, the pair (user + part of a hash, rest) shared a
    /// cache key with another pair; a verified wrong-user answer then let the other in.
    #[tokio::test]
    async fn cache_keys_are_not_ambiguous() {
        let users = users();
        let hash = users.hashes["alice"].clone();
        let (head, tail) = hash.split_at(10);
        assert_ne!(
            cache_key(&format!("alice{head}"), "", tail.as_bytes()),
            cache_key("alice", "", hash.as_bytes())
        );
        assert_ne!(cache_key("ab", "c", b""), cache_key("a", "bc", b""));
        assert_ne!(cache_key("a", "", b"bc"), cache_key("ab", "", b"c"));
        // The toolkit's regression: a user name carrying the hash, then the password carrying it.
        let _ = users
            .check(Some(&basic(&format!("alice{hash}"), "alice123")))
            .await;
        assert_eq!(
            users
                .check(Some(&basic("alice", &format!("{hash}alice123"))))
                .await,
            Err(AuthFailure::WrongPassword)
        );
    }

    /// A password not yet verified waits at most [`BCRYPT_WAIT`] for its turn at bcrypt, then
    /// is told the server is busy (503); one already verified never waits for a turn.
    #[tokio::test(start_paused = true)]
    async fn no_turn_at_bcrypt_within_the_wait_is_busy() {
        let users = users();
        assert_eq!(users.check(Some(&basic("alice", "alice123"))).await, Ok(()));
        let _every_turn = users
            .turns
            .clone()
            .acquire_many_owned(BCRYPT_AT_ONCE as u32)
            .await;
        let asked = tokio::time::Instant::now();
        assert_eq!(
            users.check(Some(&basic("bob", "bob123"))).await,
            Err(AuthFailure::Busy)
        );
        assert!(asked.elapsed() >= BCRYPT_WAIT);
        assert_eq!(users.check(Some(&basic("alice", "alice123"))).await, Ok(()));
        assert_eq!(
            unauthorized(AuthFailure::Busy).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    proptest::proptest! {
        /// Any header value decodes to credentials or to none, never a panic.
        #[test]
        fn any_authorization_header_is_taken_or_refused(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100)) {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                let _ = basic_credentials(&value);
            }
            let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
            let _ = basic_credentials(&HeaderValue::from_str(&format!("Basic {encoded}")).unwrap());
        }

        /// Any text as a stored hash is a bcrypt one or refused, never a panic.
        #[test]
        fn any_hash_is_taken_or_refused(hash in "\\$2[abxy]\\$[0-9]{2}\\$[./A-Za-z0-9é]{0,60}|.{0,70}") {
            let _ = bcrypt_cost(&hash);
        }
    }

    #[test]
    fn only_bcrypt_hashes() {
        let good = bcrypt::hash("x", 4).unwrap();
        assert_eq!(bcrypt_cost(&good), Ok(4));
        for (hash, said) in [
            ("secret", "$2a$, $2b$ or $2y$"),
            ("$1$abc$defghijklmnop", "$2a$, $2b$ or $2y$"),
            (&good.replacen("$2b$", "$2x$", 1), "$2a$, $2b$ or $2y$"),
            (&good[..50], "malformed"),
            (&good.replacen("$04$", "$03$", 1), "outside 4 to 31"),
            ("$2y$10$é", "malformed"),
        ] {
            let e = bcrypt_cost(hash).unwrap_err();
            assert!(e.contains(said), "{hash}: {e}");
        }
    }
}
