//! Tag filters decided from the index alone.
//!
//! Each index entry keeps a hash of the entry's tag (`IndexExtras::tag_hash`,
//! written at append). A subscription with a tag filter skips an entry whose
//! hash differs from its filter's without reading it: the entry counts as
//! acknowledged for that subscription. Equal hashes (or an index entry from
//! before the field existed, hash 0) mean "read it and compare the tag
//! itself". Owned by the topic's shard; never crosses cores.

use super::context::LogReader;
use crate::subscription::Subscription;

/// Whether `entry` of `ledger` certainly does not match `sub`'s filter,
/// judged from the index without reading the entry.
pub(crate) fn unmatched_by_index(log: &impl LogReader, sub: &Subscription, ledger: u64, entry: u64) -> bool {
    let want = match sub.filter_tag.borrow().as_deref() {
        Some(tag) => magnetar_storage::tag_hash(Some(tag.as_bytes())),
        None => return false,
    };
    match log.tag_hash(ledger, entry) {
        Some(hash) => hash != 0 && hash != want,
        // Not laid out yet (dispatch reads only durable entries, which are),
        // or its index page is not in memory: decide on the entry itself.
        None => false,
    }
}
