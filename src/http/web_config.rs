//! exporter-toolkit's web configuration file (`web_config_file`), the one node_exporter,
//! Prometheus and Alertmanager read with `--web.config.file`: TLS for the HTTP port
//! (`tls_server_config`, built by [`super::tls`]), response headers and HTTP/2
//! (`http_server_config`), and bcrypt users (`basic_auth_users`, checked by [`super::auth`]).
//!
//! [`load`] reads it as the toolkit's v0.8 does (Prometheus 2.42's `promtool check web-config`):
//! every key of the file is known or refused, and a file that reads is one the server can serve
//! (its certificate and key loaded, each hash a bcrypt one). [`Shared`] is the one in force,
//! replaced at a SIGHUP.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::http::{HeaderName, HeaderValue};
use serde::Deserialize;

use super::auth::Users;
use super::tls::{ClientAuth, TlsSettings};
use crate::config::{Config, ConfigError, err};

/// The file's keys, as the toolkit's `Config` struct (v0.8.2) names them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsSection>,
    http_server_config: Option<HttpSection>,
    basic_auth_users: Option<UniqueMap>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct TlsSection {
    cert_file: String,
    key_file: String,
    client_auth_type: String,
    client_ca_file: String,
    cipher_suites: Vec<String>,
    curve_preferences: Vec<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    prefer_server_cipher_suites: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct HttpSection {
    http2: Option<bool>,
    headers: BTreeMap<String, String>,
}

/// A YAML mapping whose keys are unique, as Go's strict YAML reading demands: a user named
/// twice is an error, not the last one winning.
#[derive(Debug, Default)]
struct UniqueMap(Vec<(String, String)>);

impl<'de> Deserialize<'de> for UniqueMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = UniqueMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a mapping of user names to bcrypt hashes")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<UniqueMap, A::Error> {
                let mut entries: Vec<(String, String)> = Vec::new();
                while let Some((user, hash)) = map.next_entry::<String, String>()? {
                    if entries.iter().any(|(u, _)| *u == user) {
                        return Err(serde::de::Error::custom(format!(
                            "user {user:?} is named twice"
                        )));
                    }
                    entries.push((user, hash));
                }
                Ok(UniqueMap(entries))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// The headers the toolkit lets a file set, and the values it allows where they are an
/// enumeration (none: any value).
const HEADERS: [(&str, &[&str]); 5] = [
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

/// A web configuration file, read and checked.
#[derive(Debug)]
pub struct WebConfig {
    /// TLS on the port; `None`: plain HTTP (the file sets no TLS key).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Headers set on every response, 401s included.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Users a request must be one of; `None`: no password asked.
    pub users: Option<Arc<Users>>,
}

/// ALPN offered with `http2: true` (the toolkit's default; HTTP/2 over TLS only), and without.
const ALPN_H2: [&[u8]; 2] = [b"h2", b"http/1.1"];
const ALPN_H1: [&[u8]; 1] = [b"http/1.1"];

/// The file at `path`; an error names the file and the problem, under the key
/// `web_config_file`.
pub fn load(path: &Path) -> Result<WebConfig, ConfigError> {
    read(path).map_err(|e| err("web_config_file", format!("{}: {e}", path.display())))
}

/// The file `config` names, `None` without one.
pub fn load_configured(config: &Config) -> Result<Option<WebConfig>, ConfigError> {
    match config.web_config_file.as_os_str().is_empty() {
        true => Ok(None),
        false => load(&config.web_config_file).map(Some),
    }
}

fn read(path: &Path) -> Result<WebConfig, String> {
    let text = crate::config::read_text(path).map_err(|e| e.to_string())?;
    parse(&text, path.parent().unwrap_or(Path::new(".")))
}

/// A file's text; relative paths in it are `dir`'s.
fn parse(text: &str, dir: &Path) -> Result<WebConfig, String> {
    let file: File = if text.trim().is_empty() {
        File::default()
    } else {
        yaml_serde::from_str(text).map_err(|e| {
            // One line: the YAML reader's messages may span several.
            e.to_string()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })?
    };
    let http = file.http_server_config.unwrap_or_default();
    let headers = headers(&http.headers)?;
    let users = match file.basic_auth_users {
        Some(UniqueMap(users)) if !users.is_empty() => Some(Arc::new(Users::new(users)?)),
        _ => None,
    };
    let tls = match tls_settings(file.tls_server_config.unwrap_or_default(), dir)? {
        None => None,
        Some(settings) => {
            let alpn: &[&[u8]] = match http.http2.unwrap_or(true) {
                true => &ALPN_H2,
                false => &ALPN_H1,
            };
            Some(super::tls::server_config(&settings, alpn)?)
        }
    };
    Ok(WebConfig {
        tls,
        headers,
        users,
    })
}

fn headers(
    configured: &BTreeMap<String, String>,
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    configured
        .iter()
        .map(|(name, value)| {
            let Some((_, allowed)) = HEADERS.iter().find(|(n, _)| n == name) else {
                return Err(format!("HTTP header {name:?} can not be configured"));
            };
            if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
                return Err(format!(
                    "invalid value for {name}. Expected one of: {allowed:?}, but got: {value:?}"
                ));
            }
            let value = HeaderValue::from_str(value)
                .map_err(|_| format!("{name}: {value:?} is not a valid header value"))?;
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("{name:?} is not a header name"))?;
            Ok((name, value))
        })
        .collect()
}

/// The TLS section, `None` when it sets none of the keys that turn TLS on (the toolkit's
/// rule: cert_file, key_file, client_auth_type or client_ca_file).
fn tls_settings(section: TlsSection, dir: &Path) -> Result<Option<TlsSettings>, String> {
    let TlsSection {
        cert_file,
        key_file,
        client_auth_type,
        client_ca_file,
        cipher_suites,
        curve_preferences,
        min_version,
        max_version,
        prefer_server_cipher_suites,
    } = section;
    if [&cert_file, &key_file, &client_auth_type, &client_ca_file]
        .iter()
        .all(|k| k.is_empty())
    {
        return Ok(None);
    }
    if cert_file.is_empty() {
        return Err("tls_server_config: missing cert_file".into());
    }
    if key_file.is_empty() {
        return Err("tls_server_config: missing key_file".into());
    }
    let client_auth = ClientAuth::parse(&client_auth_type)
        .ok_or_else(|| format!("Invalid ClientAuth: {client_auth_type}"))?;
    let resolve = |p: String| -> PathBuf { dir.join(p) };
    Ok(Some(TlsSettings {
        cert_file: resolve(cert_file),
        key_file: resolve(key_file),
        client_auth,
        client_ca_file: (!client_ca_file.is_empty()).then(|| resolve(client_ca_file)),
        cipher_suites,
        curve_preferences,
        min_version: min_version.unwrap_or_else(|| "TLS12".into()),
        max_version: max_version.unwrap_or_else(|| "TLS13".into()),
        prefer_server_cipher_suites: prefer_server_cipher_suites.unwrap_or(true),
    }))
}

/// The web configuration in force, read by each new connection (TLS) and each request (users,
/// headers); replaced whole at a SIGHUP.
#[derive(Debug, Default)]
pub struct Shared(RwLock<Option<Arc<WebConfig>>>);

impl Shared {
    pub fn new(config: Option<WebConfig>) -> Shared {
        Shared(RwLock::new(config.map(Arc::new)))
    }

    pub fn current(&self) -> Option<Arc<WebConfig>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn replace(&self, config: Option<WebConfig>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = config.map(Arc::new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the file holds, reading it answers, never panics.
        #[test]
        fn any_text_reads_or_is_refused(text in "(tls_server_config|http_server_config|basic_auth_users|headers|cert_file|http2|[:\\-\\[\\]{}$ \n\t'\"a-z0-9]){0,40}") {
            let _ = parse(&text, Path::new("/nonexistent"));
        }

        #[test]
        fn any_bytes_read_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse(&String::from_utf8_lossy(&bytes), Path::new("/nonexistent"));
        }
    }
}
