//! Topic names: `{persistent|non-persistent}://tenant/namespace/topic`.
//!
//! A bare `topic` means `persistent://public/default/topic`, as in Pulsar. A
//! partition of a partitioned topic is the topic `…-partition-<i>`.

use std::fmt;

/// Longest topic name accepted, in bytes (the whole `persistent://…` form).
pub const TOPIC_NAME_BYTES_MAX: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Domain {
    Persistent,
    NonPersistent,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicName {
    pub domain: Domain,
    pub tenant: String,
    pub namespace: String,
    /// The local name, including any `-partition-<i>` suffix.
    pub local: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid topic name {name:?}: {reason}")]
pub struct TopicNameError {
    pub name: String,
    pub reason: &'static str,
}

fn valid_part(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'=' | b':'))
}

impl TopicName {
    pub fn parse(name: &str) -> Result<Self, TopicNameError> {
        let err = |reason| TopicNameError { name: name.chars().take(600).collect(), reason };
        if name.len() > TOPIC_NAME_BYTES_MAX {
            return Err(err("longer than 512 bytes"));
        }
        let (domain, rest) = if let Some(rest) = name.strip_prefix("persistent://") {
            (Domain::Persistent, rest)
        } else if let Some(rest) = name.strip_prefix("non-persistent://") {
            (Domain::NonPersistent, rest)
        } else if name.contains("://") {
            return Err(err("domain must be persistent:// or non-persistent://"));
        } else if name.contains('/') {
            return Err(err("a short name may not contain '/'; use persistent://tenant/namespace/topic"));
        } else {
            (Domain::Persistent, name)
        };
        let parts: Vec<&str> =
            if name.contains("://") { rest.split('/').collect() } else { vec!["public", "default", rest] };
        if parts.len() != 3 {
            return Err(err("expected tenant/namespace/topic after the domain"));
        }
        if !valid_part(parts[0]) || !valid_part(parts[1]) {
            return Err(err("tenant and namespace may hold only [A-Za-z0-9-_.=:]"));
        }
        if !valid_part(parts[2]) {
            return Err(err("the topic may hold only [A-Za-z0-9-_.=:] and must not be empty"));
        }
        Ok(Self { domain, tenant: parts[0].to_string(), namespace: parts[1].to_string(), local: parts[2].to_string() })
    }

    /// `tenant/namespace`.
    pub fn namespace_name(&self) -> String {
        format!("{}/{}", self.tenant, self.namespace)
    }

    /// The partition index when the local name ends in `-partition-<i>`.
    pub fn partition(&self) -> Option<u32> {
        let (_, idx) = self.local.rsplit_once("-partition-")?;
        idx.parse().ok()
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = match self.domain {
            Domain::Persistent => "persistent",
            Domain::NonPersistent => "non-persistent",
        };
        write!(f, "{d}://{}/{}/{}", self.tenant, self.namespace, self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_and_short_names() {
        let t = TopicName::parse("persistent://public/default/orders").unwrap();
        assert_eq!(t.to_string(), "persistent://public/default/orders");
        let s = TopicName::parse("orders").unwrap();
        assert_eq!(s, t);
        let p = TopicName::parse("persistent://a/b/c-partition-3").unwrap();
        assert_eq!(p.partition(), Some(3));
        assert_eq!(t.partition(), None);
    }

    #[test]
    fn rejects_bad_names() {
        for bad in [
            "",
            "http://a/b/c",
            "persistent://a/b",
            "persistent://a/b/c/d",
            "persistent://a//c",
            "a/b",
            "persistent://a/b/c d",
            "persistent://a/b/c\n",
        ] {
            assert!(TopicName::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(TopicName::parse(&"x".repeat(600)).is_err());
    }
}
