//! The native door's admin requests: the one place that maps them between
//! the wire's JSON text and the broker.

use crate::native::NativeDoor;
use crate::session::Session;
use magnetar_wire::Command;
use std::rc::Rc;

/// Per-subscription statistics of `topic`, answered as JSON. Awaited
/// before the connection's next request is read.
pub(super) async fn topic_stats(session: &Rc<Session<NativeDoor>>, request_id: u64, topic: String) {
    match session.broker_handle().topic_stats(&topic).await {
        Ok(json) => {
            let stats = Command::TopicStats { request_id, topic, json };
            session.out().put("topic stats", |_, dst| super::push(dst, &stats));
        }
        Err(e) => session.out().error(request_id, &e),
    }
}

/// An admin or lookup operation, in its own task: the connection's other
/// requests go on meanwhile.
pub(super) fn spawn_admin(session: &Rc<Session<NativeDoor>>, request_id: u64, op: String, json: String) {
    let session = session.clone();
    glommio::spawn_local(async move {
        match session.broker_handle().admin(&op, &json).await {
            Ok(mut json) => {
                if op == "topics.lookup" {
                    json = add_broker_address(&json, session.local_addr());
                }
                let response = Command::AdminResponse { request_id, json };
                session.out().put("an admin response", |_, dst| super::push(dst, &response));
            }
            Err(e) => session.out().error(request_id, &e),
        }
    })
    .detach();
}

/// Lookup answers name the broker that owns the topic: in a single-broker
/// deployment, the address this connection reached.
fn add_broker_address(json: &str, local: Option<&str>) -> String {
    let Some(local) = local else { return json.to_string() };
    let quoted = format!("{local:?}");
    match json.strip_suffix('}') {
        Some(head) if head.starts_with('{') => format!("{head},\"broker\":{quoted}}}"),
        _ => json.to_string(),
    }
}
