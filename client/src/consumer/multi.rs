//! Consuming several topics through one handle: a partitioned topic by its
//! own name (one consumer per partition), or a list of topics. Messages of
//! all of them arrive on one queue; each keeps its topic and its id (whose
//! `partition` names the partition), and acks go to the consumer of the
//! message's topic.
//!
//! The members' connection slots put their deliveries straight into the
//! shared queue, each tagged with the member's index; `receive` hands each
//! to its member (`Consumer::accept`: flow permits, chunks, dead letters,
//! batch tracking) on the way out. So a message is queued once, and a
//! member's permits come back as the application receives its messages.

use super::inbox::Unpacking;
use super::{Consumer, ConsumerBuilder};
use crate::conn::demux::{Inbound, Queued};
use crate::error::{ClientError, Result};
use crate::message::Message;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Up to this many members, an ack finds its member by comparing topic
/// pointers; beyond, by the topic's name in a map.
const MEMBER_SCAN_MAX: usize = 16;

#[derive(Clone)]
enum Member {
    /// Subscribing; its deliveries may already come.
    Joining,
    Live(Arc<Consumer>),
    /// Its subscribe failed.
    Failed,
}

#[derive(Default)]
struct Members {
    /// By index (the `source` of its queued deliveries).
    list: Vec<Member>,
    by_topic: HashMap<String, u32>,
}

/// The receiving side: the queue, and a copy of the members it has seen.
struct Receiving {
    rx: mpsc::UnboundedReceiver<Queued>,
    members: Vec<Member>,
    /// Members whose connection slot is gone (`Inbound::End` came).
    ended: Vec<bool>,
    ended_count: usize,
    /// Deliveries that came before their member was known, in order.
    held: VecDeque<Queued>,
    /// What is left of the entries taken off the queue last, and their
    /// member (live): handed out before anything else.
    rest: Unpacking,
    rest_source: u32,
}

impl Receiving {
    fn mark_ended(&mut self, source: u32) {
        if let Some(e) = self.ended.get_mut(source as usize) {
            if !*e {
                *e = true;
                self.ended_count += 1;
            }
        }
    }
}

/// A member `add_topic` registered, until its subscribe answers.
struct Joining<'a> {
    multi: &'a MultiTopicConsumer,
    index: u32,
    topic: String,
    armed: bool,
}

impl Drop for Joining<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.multi.settle(self.index, &self.topic, None);
        }
    }
}

/// A consumer over several topics. `Send + Sync`.
pub struct MultiTopicConsumer {
    subscription: String,
    members: Mutex<Members>,
    tx: mpsc::UnboundedSender<Queued>,
    rx: tokio::sync::Mutex<Receiving>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for MultiTopicConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiTopicConsumer").field("subscription", &self.subscription).finish_non_exhaustive()
    }
}

impl Drop for MultiTopicConsumer {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
    }
}

impl MultiTopicConsumer {
    /// An empty consumer; add topics with [`add_topic`](Self::add_topic).
    /// Each topic's consumer gets its own flow permits (its receiver queue
    /// size); the shared queue holds what they were sent.
    pub(crate) fn new(subscription: String) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            subscription,
            members: Mutex::new(Members::default()),
            tx,
            rx: tokio::sync::Mutex::new(Receiving {
                rx,
                members: Vec::new(),
                ended: Vec::new(),
                ended_count: 0,
                held: VecDeque::new(),
                rest: Unpacking::default(),
                rest_source: 0,
            }),
            tasks: Mutex::new(Vec::new()),
        }
    }

    fn lock_members(&self) -> std::sync::MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Topics consumed now, sorted.
    pub fn topics(&self) -> Vec<String> {
        let members = self.lock_members();
        let mut t: Vec<String> = members
            .by_topic
            .iter()
            .filter(|(_, &i)| matches!(members.list.get(i as usize), Some(Member::Live(_))))
            .map(|(t, _)| t.clone())
            .collect();
        t.sort();
        t
    }

    pub fn subscription(&self) -> &str {
        &self.subscription
    }

    /// Subscribes `builder`'s topic (a single topic or partition); its
    /// messages come through the shared queue. A topic already consumed
    /// (or being subscribed) is skipped.
    pub async fn add_topic(&self, mut builder: ConsumerBuilder) -> Result<()> {
        let topic = crate::names::normalize_topic(&builder.topic)?;
        let index = {
            let mut members = self.lock_members();
            if members.by_topic.contains_key(&topic) {
                return Ok(());
            }
            let index = u32::try_from(members.list.len())
                .map_err(|_| ClientError::InvalidOption { option: "topics", reason: "too many topics" })?;
            members.list.push(Member::Joining);
            members.by_topic.insert(topic.clone(), index);
            index
        };
        builder.inbox = Some((self.tx.clone(), index));
        // Dropped before the subscribe answers (the caller's future was
        // cancelled): the member fails, so the topic can be added again.
        let mut joining = Joining { multi: self, index, topic, armed: true };
        let subscribed = builder.subscribe().await.map(Arc::new);
        joining.armed = false;
        self.settle(index, &joining.topic, subscribed.as_ref().ok().cloned());
        subscribed.map(|_| ())
    }

    /// The member `index` (`Joining` until now) is `consumer`, or failed
    /// (its topic name is free again); wakes a `receive` that holds its
    /// deliveries back.
    fn settle(&self, index: u32, topic: &str, consumer: Option<Arc<Consumer>>) {
        {
            let mut members = self.lock_members();
            let failed = consumer.is_none();
            if let Some(slot) = members.list.get_mut(index as usize) {
                *slot = match consumer {
                    Some(c) => Member::Live(c),
                    None => Member::Failed,
                };
            }
            if failed {
                members.by_topic.remove(topic);
            }
        }
        let _ = self.tx.send(Queued { source: index, item: Inbound::Joined });
    }

    pub(crate) fn adopt_task(&self, task: JoinHandle<()>) {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task);
    }

    /// The next message of any topic. Cancel-safe.
    pub async fn receive(&self) -> Result<Message> {
        // Uncontended (the usual case): no semaphore wait future per message.
        let mut q = match self.rx.try_lock() {
            Ok(q) => q,
            Err(_) => self.rx.lock().await,
        };
        if !q.rest.is_empty() {
            // Yield to the runtime now and then, as a `recv` per message
            // would, so a long batch does not starve the other tasks.
            tokio::task::coop::consume_budget().await;
        }
        loop {
            if let Some(r) = self.step_rest(&mut q) {
                return r;
            }
            if let Some(r) = self.step_held(&mut q) {
                return r;
            }
            if let Some(e) = self.all_ended(&mut q) {
                return Err(e);
            }
            // The multi-topic consumer holds a sender: never `None`.
            let Some(queued) = q.rx.recv().await else { return Err(self.closed()) };
            // Nothing below awaits (cancel safety).
            if let Some(r) = self.step(&mut q, queued) {
                return r;
            }
        }
    }

    /// The next message if one is already here.
    pub fn try_receive(&self) -> Result<Option<Message>> {
        let Ok(mut q) = self.rx.try_lock() else { return Ok(None) };
        loop {
            if let Some(r) = self.step_rest(&mut q) {
                return r.map(Some);
            }
            if let Some(r) = self.step_held(&mut q) {
                return r.map(Some);
            }
            if let Some(e) = self.all_ended(&mut q) {
                return Err(e);
            }
            match q.rx.try_recv() {
                Ok(queued) => {
                    if let Some(r) = self.step(&mut q, queued) {
                        return r.map(Some);
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => return Ok(None),
                Err(mpsc::error::TryRecvError::Disconnected) => return Err(self.closed()),
            }
        }
    }

    fn closed(&self) -> ClientError {
        ClientError::ConsumerClosed { subscription: self.subscription.clone() }
    }

    /// The member `source` as the receiving side knows it, refreshed from
    /// the members' list when it does not know it yet.
    fn member<'a>(&self, q: &'a mut Receiving, source: u32) -> &'a Member {
        let i = source as usize;
        if !matches!(q.members.get(i), Some(Member::Live(_) | Member::Failed)) {
            self.refresh(q);
        }
        q.members.get(i).unwrap_or(&Member::Joining)
    }

    fn refresh(&self, q: &mut Receiving) {
        q.members.clone_from(&self.lock_members().list);
        if q.ended.len() < q.members.len() {
            q.ended.resize(q.members.len(), false);
        }
    }

    /// Hands out the rest of the last entries taken off, in order.
    fn step_rest(&self, q: &mut Receiving) -> Option<Result<Message>> {
        while let Some(d) = q.rest.next() {
            let source = q.rest_source;
            let uncounted = q.rest.take_uncounted_permits();
            if let Member::Live(c) = self.member(q, source) {
                c.grant_uncounted(uncounted);
                if let Some(r) = c.accept(d) {
                    return Some(r);
                }
            }
        }
        None
    }

    /// Takes on the entries of `item` for the live member `source`, and
    /// hands out the first of them it accepts.
    fn unpack(&self, q: &mut Receiving, source: u32, item: Inbound) -> Option<Result<Message>> {
        // Only entries come here: `End` and `Joined` are matched first.
        let _marker = q.rest.load(item);
        q.rest_source = source;
        self.step_rest(q)
    }

    fn step(&self, q: &mut Receiving, queued: Queued) -> Option<Result<Message>> {
        let Queued { source, item } = queued;
        // Behind what is held back for the same member (its order).
        let behind = !q.held.is_empty() && q.held.iter().any(|h| h.source == source);
        let member = if behind { &Member::Joining } else { self.member(q, source) };
        let ended = match (item, member) {
            (Inbound::Joined, _) => return None,
            (Inbound::End, Member::Live(c)) => c.closed_error(),
            (item, Member::Live(_)) => return self.unpack(q, source, item),
            (item, Member::Joining) => {
                q.held.push_back(Queued { source, item });
                return None;
            }
            // A member whose subscribe failed: nothing of it goes out.
            (_, Member::Failed) => return None,
        };
        q.mark_ended(source);
        Some(Err(ended))
    }

    /// Hands out what was held back for members known now, in order.
    fn step_held(&self, q: &mut Receiving) -> Option<Result<Message>> {
        if q.held.is_empty() {
            return None;
        }
        self.refresh(q);
        let known =
            |q: &Receiving, h: &Queued| !matches!(q.members.get(h.source as usize), Some(Member::Joining) | None);
        while let Some(pos) = q.held.iter().position(|h| known(q, h)) {
            let h = q.held.remove(pos)?;
            // `step` would hold it again behind its own held siblings.
            let Queued { source, item } = h;
            let out = match (item, q.members.get(source as usize)) {
                (Inbound::End, Some(Member::Live(c))) => {
                    let e = c.closed_error();
                    q.mark_ended(source);
                    Some(Err(e))
                }
                // Its rest goes out before the held items after it.
                (item @ (Inbound::Entry { .. } | Inbound::Run { .. } | Inbound::Failed(_)), Some(Member::Live(_))) => {
                    self.unpack(q, source, item)
                }
                _ => None,
            };
            if let Some(r) = out {
                return Some(r);
            }
        }
        None
    }

    /// Once every member's slot is gone (and nothing is queued or held),
    /// `receive` would wait for ever: the error of one of them instead.
    fn all_ended(&self, q: &mut Receiving) -> Option<ClientError> {
        if q.ended_count == 0 || !q.rx.is_empty() || !q.held.is_empty() || !q.rest.is_empty() {
            return None;
        }
        let members = self.lock_members();
        let mut first = None;
        for (i, m) in members.list.iter().enumerate() {
            match m {
                Member::Joining => return None,
                Member::Failed => {}
                Member::Live(c) => {
                    if !q.ended.get(i).copied().unwrap_or(false) {
                        return None;
                    }
                    first.get_or_insert_with(|| c.closed_error());
                }
            }
        }
        first
    }

    /// The member consumer `msg` came from: by the topic's pointer (every
    /// message of a member shares its topic name), else by name.
    fn consumer_of(&self, msg: &Message) -> Result<Arc<Consumer>> {
        let members = self.lock_members();
        let live = || members.list.iter().filter_map(|m| if let Member::Live(c) = m { Some(c) } else { None });
        if members.list.len() <= MEMBER_SCAN_MAX {
            if let Some(c) = live().find(|c| c.delivers(&msg.topic)) {
                return Ok(c.clone());
            }
        }
        if let Some(Member::Live(c)) = members.by_topic.get(&*msg.topic).and_then(|&i| members.list.get(i as usize)) {
            return Ok(c.clone());
        }
        // A retry topic's message, or a message built by hand.
        live().find(|c| c.delivers_named(&msg.topic)).cloned().ok_or_else(|| self.closed())
    }

    /// Acknowledge `msg` on its topic's subscription.
    pub async fn ack(&self, msg: &Message) -> Result<()> {
        self.consumer_of(msg)?.ack(&msg.id).await
    }

    /// Negative acknowledgement: the message comes again after the
    /// consumer's backoff (see `Consumer::negative_acknowledge`).
    pub fn negative_acknowledge(&self, msg: &Message) {
        if let Ok(c) = self.consumer_of(msg) {
            c.negative_acknowledge(msg);
        }
    }

    /// Consume `msg` again after `delay` (see `Consumer::reconsume_later`).
    pub async fn reconsume_later(&self, msg: &Message, delay: std::time::Duration) -> Result<magnetar_wire::MessageId> {
        self.consumer_of(msg)?.reconsume_later(msg, delay).await
    }

    /// Consume `msg` again after its retry policy's delay, or send it to the
    /// dead-letter topic past the policy's limit (see `Consumer::reconsume`).
    pub async fn reconsume(&self, msg: &Message) -> Result<super::Reconsumed> {
        self.consumer_of(msg)?.reconsume(msg).await
    }

    pub async fn ack_cumulative(&self, msg: &Message) -> Result<()> {
        self.consumer_of(msg)?.ack_cumulative(&msg.id).await
    }

    /// Close every topic's consumer; the first error is returned. The
    /// refresh task (patterns, partitions added later) stops first, so no
    /// topic is subscribed after the close.
    pub async fn close(&self) -> Result<()> {
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
        let consumers: Vec<Arc<Consumer>> = self
            .lock_members()
            .list
            .iter()
            .filter_map(|m| if let Member::Live(c) = m { Some(c.clone()) } else { None })
            .collect();
        let mut first = Ok(());
        for c in consumers {
            if let Err(e) = c.close().await {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

/// Splits a topics pattern into its literal namespace (`tenant/ns`) and the
/// anchored regular expression over full topic names.
pub(crate) fn parse_pattern(pattern: &str) -> Result<(String, regex::Regex)> {
    let bad = |reason| ClientError::InvalidTopic { topic: pattern.to_string(), reason };
    let full =
        if pattern.contains("://") { pattern.to_string() } else { format!("persistent://public/default/{pattern}") };
    let rest = full.split_once("://").map(|(_, r)| r).unwrap_or_default();
    let mut parts = rest.splitn(3, '/');
    let (Some(tenant), Some(ns), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("a topics pattern is DOMAIN://TENANT/NAMESPACE/REGEX"));
    };
    let literal = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_=:".contains(c));
    if !literal(tenant) || !literal(ns) {
        return Err(bad("the tenant and namespace of a topics pattern must be literal names"));
    }
    let regex = regex::Regex::new(&format!("^(?:{full})$")).map_err(|_| bad("not a valid regular expression"))?;
    Ok((format!("{tenant}/{ns}"), regex))
}

/// Subscribes every topic of `namespace` matching `regex` not yet consumed.
pub(crate) async fn add_matching(
    template: &ConsumerBuilder,
    multi: &MultiTopicConsumer,
    namespace: &str,
    regex: &regex::Regex,
) -> Result<()> {
    let admin = template.origin.admin();
    let names = admin.list_topics(namespace).await?;
    for name in &names {
        // A partition is covered by its partitioned topic's own name.
        if let Some((base, _)) = name.rsplit_once("-partition-") {
            if names.iter().any(|n| n == base) {
                continue;
            }
        }
        if regex.is_match(name) {
            template.add_by_name(multi, name).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let (ns, re) = parse_pattern("persistent://public/default/orders-.*").unwrap();
        assert_eq!(ns, "public/default");
        assert!(re.is_match("persistent://public/default/orders-eu"));
        assert!(!re.is_match("persistent://public/default/x-orders-eu"));
        assert!(!re.is_match("persistent://public/other/orders-eu"));
        let (ns, _) = parse_pattern("orders.*").unwrap();
        assert_eq!(ns, "public/default");
        assert!(parse_pattern("persistent://pub.*/default/x").is_err());
        assert!(parse_pattern("persistent://public/default/(").is_err());
    }
}
