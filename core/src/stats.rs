//! Per-subscription statistics of a topic, as a JSON object (the admin
//! command `magnetar admin subscriptions stats TOPIC`). Built on the owner
//! shard from its subscriptions; the core has no JSON library, and this is
//! the only JSON it writes.

use crate::dispatcher::Policy;
use crate::topic::Topic;

/// Layout: `{"topic":…,"next_entry":…,"ledgers":[{"ledger":…,"first":…,
/// "entries":…,"bytes":…}],"subscriptions":{NAME:{"type":…,
/// "ack_floor":…,"msg_backlog":…,"unacked":…,"delayed":…,"replay":…,
/// "msg_out_total":…,"consumers":[{"name":…,"priority":…,"permits":…,
/// "unacked":…,"active":…}]}}}`. `msg_backlog` counts entries not
/// acknowledged (sent or not); `active` is meaningful for Failover/Exclusive.
/// `next_entry`, `ack_floor` and `first` are topic positions (entries
/// numbered across ledgers, see `ledgers.rs`); `ledgers` lists the stored
/// ledgers, oldest first, the last one current.
pub(crate) fn topic_stats_json(t: &Topic) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{{\"topic\":{},\"next_entry\":{},\"ledgers\":{},\"subscriptions\":{{",
        quote(&t.key),
        t.next_entry.get(),
        ledgers_json(&t.ledgers.borrow())
    ));
    let subs = t.subs.borrow();
    let mut names: Vec<&String> = subs.keys().collect();
    names.sort();
    for (i, name) in names.into_iter().enumerate() {
        let Some(s) = subs.get(name) else { continue };
        let cursor = s.cursor.borrow();
        let next = t.durable_next.get();
        let above_floor = cursor.acked.range(cursor.ack_floor..next).count() as u64;
        let backlog = next.saturating_sub(cursor.ack_floor).saturating_sub(above_floor);
        let active = match &*s.policy.borrow() {
            Policy::Single(a) => a.current,
            _ => None,
        };
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            "{}:{{\"type\":\"{:?}\",\"ack_floor\":{},\"msg_backlog\":{},\"unacked\":{},\"delayed\":{},\"replay\":{},\"msg_out_total\":{},\"consumers\":[",
            quote(name),
            s.sub_type.get(),
            cursor.ack_floor,
            backlog,
            s.pending.borrow().len(),
            s.delayed.borrow().len(),
            s.replay.borrow().len(),
            s.delivered_total.get(),
        ));
        for (j, c) in s.consumers.borrow().iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let is_active = active == Some(c.consumer) || !matches!(&*s.policy.borrow(), Policy::Single(_));
            out.push_str(&format!(
                "{{\"name\":{},\"priority\":{},\"permits\":{},\"unacked\":{},\"active\":{}}}",
                quote(&c.name),
                c.priority,
                c.permits,
                c.unacked,
                is_active
            ));
        }
        out.push_str("]}");
    }
    out.push_str("}}");
    out
}

/// The stored ledgers as a JSON array.
fn ledgers_json(l: &crate::ledgers::TopicLedgers) -> String {
    let items: Vec<String> = l
        .all()
        .iter()
        .map(|x| {
            format!("{{\"ledger\":{},\"first\":{},\"entries\":{},\"bytes\":{}}}", x.id, x.first, x.entries, x.bytes)
        })
        .collect();
    format!("[{}]", items.join(","))
}

/// A JSON string literal.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quotes_escape() {
        assert_eq!(quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
