//! Parsing of service URLs and topic names.

use crate::error::ClientError;

/// The broker's default native-protocol port.
pub const DEFAULT_PORT: u16 = 6650;

/// A parsed service URL: where to open the TCP connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceUrl {
    /// Host name or IP address; IPv6 addresses are kept without brackets.
    pub host: String,
    pub port: u16,
    /// `magnetar+tls://` or `pulsar+ssl://`: the connection uses TLS.
    pub tls: bool,
}

impl std::fmt::Display for ServiceUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "magnetar+tls" } else { "magnetar" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

/// Parse `magnetar://HOST:PORT` or `HOST:PORT` (IPv6 as `[ADDR]:PORT`);
/// `magnetar+tls://HOST:PORT` and `pulsar+ssl://HOST:PORT` ask for TLS.
/// `pulsar://HOST:PORT` is the same as `magnetar://`: the broker's port
/// serves both protocols (the first bytes of a connection choose the door),
/// so a Pulsar URL copied from an application reaches the same broker; this
/// client still speaks the native protocol on it.
///
/// The port may be left out and defaults to 6650. A trailing `/` is
/// tolerated; any other path, a user part or another scheme is refused, so a
/// typo is reported instead of silently connecting somewhere else.
pub fn parse_service_url(url: &str) -> Result<ServiceUrl, ClientError> {
    let bad = |reason| ClientError::InvalidUrl { url: url.to_string(), reason };
    let trimmed = url.trim();
    let (rest, tls) = match trimmed.split_once("://") {
        Some(("magnetar" | "pulsar", rest)) => (rest, false),
        Some(("magnetar+tls" | "pulsar+ssl", rest)) => (rest, true),
        Some(_) => {
            return Err(bad("the supported schemes are magnetar://, pulsar://, magnetar+tls:// and pulsar+ssl://"))
        }
        None => (trimmed, false),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Err(bad("missing host"));
    }
    if rest.contains('/') || rest.contains('@') || rest.contains('?') {
        return Err(bad("expected only HOST:PORT after the scheme"));
    }
    let (host, port) = if let Some(after_bracket) = rest.strip_prefix('[') {
        let (host, tail) = after_bracket.split_once(']').ok_or_else(|| bad("unclosed '[' in IPv6 host"))?;
        let port = match tail {
            "" => None,
            t => Some(t.strip_prefix(':').ok_or_else(|| bad("expected ':' after ']'"))?),
        };
        (host, port)
    } else {
        match rest.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => return Err(bad("IPv6 hosts must be written [ADDR]:PORT")),
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        }
    };
    if host.is_empty() {
        return Err(bad("missing host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) => return Err(bad("port 0 is not a valid destination")),
            Ok(p) => p,
            Err(_) => return Err(bad("port is not a number in 1..=65535")),
        },
    };
    Ok(ServiceUrl { host: host.to_string(), port, tls })
}

/// Expand a topic name to its full form `persistent://tenant/namespace/topic`.
///
/// `topic` becomes `persistent://public/default/topic` and
/// `tenant/namespace/topic` becomes `persistent://tenant/namespace/topic`,
/// as in Pulsar. Full names with scheme `persistent` or `non-persistent`
/// are checked and returned unchanged.
pub fn normalize_topic(topic: &str) -> Result<String, ClientError> {
    let bad = |reason| ClientError::InvalidTopic { topic: topic.to_string(), reason };
    let (scheme, path) = match topic.split_once("://") {
        Some((s @ ("persistent" | "non-persistent"), path)) => (s, path),
        Some(_) => return Err(bad("the scheme must be persistent:// or non-persistent://")),
        None => ("persistent", topic),
    };
    let parts: Vec<&str> = path.split('/').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(bad("empty tenant, namespace or topic"));
    }
    if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("whitespace or control characters"));
    }
    match parts.as_slice() {
        [name] if !topic.contains("://") => Ok(format!("persistent://public/default/{name}")),
        [_, _, _] => Ok(format!("{scheme}://{path}")),
        _ => Err(bad("expected tenant/namespace/topic")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> (String, u16) {
        let u = parse_service_url(s).unwrap();
        (u.host, u.port)
    }

    #[test]
    fn urls_accepted() {
        assert_eq!(url("magnetar://127.0.0.1:6650"), ("127.0.0.1".into(), 6650));
        assert_eq!(url("127.0.0.1:7000"), ("127.0.0.1".into(), 7000));
        assert_eq!(url("localhost"), ("localhost".into(), 6650));
        assert_eq!(url("magnetar://broker.example:1/"), ("broker.example".into(), 1));
        assert_eq!(url("[::1]:6651"), ("::1".into(), 6651));
        assert_eq!(url("magnetar://[fe80::1]"), ("fe80::1".into(), 6650));
        assert_eq!(url(" host:5 "), ("host".into(), 5));
        assert!(!parse_service_url("magnetar://h:1").unwrap().tls);
        let u = parse_service_url("pulsar://127.0.0.1:6650").unwrap();
        assert!(!u.tls && u.host == "127.0.0.1" && u.port == 6650);
        for s in ["magnetar+tls://h:1", "pulsar+ssl://h:1"] {
            let u = parse_service_url(s).unwrap();
            assert!(u.tls && u.host == "h" && u.port == 1, "{s}");
        }
    }

    #[test]
    fn urls_refused() {
        for bad in [
            "",
            "magnetar://",
            "pulsar+tls://host:6650",
            "http://host:80",
            "host:",
            "host:0",
            "host:65536",
            "host:abc",
            ":6650",
            "host:6650/path",
            "user@host:6650",
            "::1:6650",
            "[::1",
            "[::1]6650",
        ] {
            match parse_service_url(bad) {
                Err(ClientError::InvalidUrl { url, .. }) => assert_eq!(url, bad),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn url_display_round_trips() {
        for s in ["magnetar://h:1", "magnetar://[::1]:6650", "magnetar+tls://h:2"] {
            assert_eq!(parse_service_url(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn topics() {
        assert_eq!(normalize_topic("orders").unwrap(), "persistent://public/default/orders");
        assert_eq!(normalize_topic("t/ns/orders").unwrap(), "persistent://t/ns/orders");
        assert_eq!(
            normalize_topic("persistent://public/default/orders").unwrap(),
            "persistent://public/default/orders"
        );
        assert_eq!(normalize_topic("non-persistent://a/b/c").unwrap(), "non-persistent://a/b/c");
        for bad in ["", "a/b", "a/b/c/d", "x://a/b/c", "persistent://orders", "a//c", "persistent://a/b/", "a b"] {
            assert!(matches!(normalize_topic(bad), Err(ClientError::InvalidTopic { .. })), "{bad:?}");
        }
    }
}
