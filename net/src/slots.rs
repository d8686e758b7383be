//! A shard's connection slots and buffered bytes: who may connect, whom to
//! evict to make room, and the shard's total of bytes held for clients.
//!
//! Owned by one shard (one value per shard, shared by its accept loops and
//! its sessions through `Rc`); never crosses cores.
//!
//! Admission, in order: a peer address already holding
//! `connections_per_peer_max` of the shard's connections is refused. When
//! fewer than `connections_reserve` slots are free, a new connection first
//! evicts the oldest connection still in its handshake, so handshake-less
//! connections cannot hold the reserve. When no slot is free, failing
//! that, the connection without producer or consumer that has been idle
//! longest is evicted; failing that, the new connection is refused.
//! Connections with a producer or a consumer are never evicted.

use magnetar_core::signal::Signal;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::Instant;

/// Bytes a shard holds for its clients: every connection's unwritten
/// output and every partly read inbound frame.
pub(crate) struct Buffers {
    bytes: Cell<usize>,
    max: usize,
    /// Readers paused on this bound, woken together when it is met again.
    waiting: RefCell<Vec<std::task::Waker>>,
}

impl Buffers {
    pub(crate) fn new(max: usize) -> Self {
        Self { bytes: Cell::new(0), max, waiting: RefCell::new(Vec::new()) }
    }

    /// Ready while within the bound; otherwise the task is woken once it is.
    pub(crate) fn poll_room(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if !self.over() {
            return std::task::Poll::Ready(());
        }
        let mut waiting = self.waiting.borrow_mut();
        if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
            waiting.push(cx.waker().clone());
        }
        std::task::Poll::Pending
    }

    pub(crate) fn add(&self, bytes: usize) {
        let was_over = self.over();
        self.bytes.set(self.bytes.get() + bytes);
        if !was_over && self.over() {
            tracing::warn!(
                buffered_bytes = self.bytes.get(),
                shard_buffered_bytes_max = self.max,
                "the shard's connections hold more than shard_buffered_bytes_max: no connection of the shard is \
                 read and deliveries pause until output drains or slow clients time out"
            );
        }
    }

    /// `bytes` added before are no longer held.
    pub(crate) fn release(&self, bytes: usize) {
        let held = self.bytes.get();
        assert!(bytes <= held, "releasing {bytes} buffered bytes of {held}");
        let was_over = self.over();
        self.bytes.set(held - bytes);
        if was_over && !self.over() {
            tracing::info!(
                buffered_bytes = self.bytes.get(),
                "the shard's connections are back within shard_buffered_bytes_max"
            );
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes.get()
    }

    /// Above the bound: no connection of the shard reads more, and
    /// deliveries to every connection of the shard pause.
    pub(crate) fn over(&self) -> bool {
        self.bytes.get() > self.max
    }
}

/// One connection as its shard's slots see it, and the handle to end it
/// from outside its read loop (eviction, a writer that timed out).
pub(crate) struct Control {
    id: u64,
    pub(crate) peer: String,
    ip: Option<IpAddr>,
    pub(crate) opened_at: Instant,
    pub(crate) buffers: Rc<Buffers>,
    /// Set once the handshake succeeded.
    handshaken: Cell<bool>,
    /// The connection has producers or consumers (or is creating one).
    busy: Cell<bool>,
    /// The last request other than a ping or pong.
    last_request: Cell<Instant>,
    /// Why the connection must end, once something decided it must.
    kill: RefCell<Option<String>>,
    /// Wakes the connection's read loop: a kill, or room in its outbox.
    pub(crate) wake: Signal,
}

impl Control {
    /// A connection outside any shard's slots (unit tests).
    #[cfg(test)]
    pub(crate) fn detached(buffers_max: usize) -> Rc<Self> {
        Rc::new(Self::new(0, String::new(), None, Rc::new(Buffers::new(buffers_max))))
    }

    fn new(id: u64, peer: String, ip: Option<IpAddr>, buffers: Rc<Buffers>) -> Self {
        let now = Instant::now();
        Self {
            id,
            peer,
            ip,
            opened_at: now,
            buffers,
            handshaken: Cell::new(false),
            busy: Cell::new(false),
            last_request: Cell::new(now),
            kill: RefCell::new(None),
            wake: Signal::new(),
        }
    }

    pub(crate) fn handshake_done(&self) {
        self.handshaken.set(true);
    }

    pub(crate) fn set_busy(&self, busy: bool) {
        self.busy.set(busy);
    }

    pub(crate) fn note_request(&self) {
        self.last_request.set(Instant::now());
    }

    pub(crate) fn last_request(&self) -> Instant {
        self.last_request.get()
    }

    /// Ends the connection with `reason` (the first reason given wins).
    pub(crate) fn kill(&self, reason: String) {
        let mut kill = self.kill.borrow_mut();
        if kill.is_none() {
            *kill = Some(reason);
        }
        drop(kill);
        self.wake.notify();
    }

    pub(crate) fn killed(&self) -> Option<String> {
        self.kill.borrow().clone()
    }
}

/// Limits on a shard's connections (see the module doc).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlotLimits {
    pub(crate) connections_max: usize,
    pub(crate) reserve: usize,
    pub(crate) per_peer_max: usize,
}

/// One shard's connections.
pub(crate) struct Slots {
    limits: SlotLimits,
    buffers: Rc<Buffers>,
    next_id: Cell<u64>,
    open: RefCell<HashMap<u64, Rc<Control>>>,
    per_peer: RefCell<HashMap<IpAddr, usize>>,
}

/// A connection's hold on its slot; dropping it frees the slot (unless it
/// was evicted, which freed it already).
pub(crate) struct Slot {
    slots: Rc<Slots>,
    pub(crate) control: Rc<Control>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.remove(self.control.id);
    }
}

impl Slots {
    pub(crate) fn new(limits: SlotLimits, buffers: Rc<Buffers>) -> Self {
        assert!(limits.reserve <= limits.connections_max, "a reserve larger than the connection limit");
        Self {
            limits,
            buffers,
            next_id: Cell::new(0),
            open: RefCell::new(HashMap::new()),
            per_peer: RefCell::new(HashMap::new()),
        }
    }

    pub(crate) fn open(&self) -> usize {
        self.open.borrow().len()
    }

    /// A slot for a new connection from `peer` (its address), evicting
    /// another connection if needed; `Err` says why it is refused.
    pub(crate) fn admit(self: &Rc<Self>, peer: Option<std::net::SocketAddr>) -> Result<Slot, String> {
        let ip = peer.map(|p| p.ip());
        if let Some(ip) = ip {
            let held = self.per_peer.borrow().get(&ip).copied().unwrap_or(0);
            if held >= self.limits.per_peer_max {
                return Err(format!(
                    "peer {ip} holds {held} connections, the limit per peer (connections_per_peer_max {})",
                    self.limits.per_peer_max
                ));
            }
        }
        let open = self.open();
        let free = self.limits.connections_max.saturating_sub(open);
        if free < self.limits.reserve || free == 0 {
            let victim = self.oldest_handshaking().or_else(|| if free == 0 { self.longest_idle() } else { None });
            match victim {
                Some(v) => self.evict(&v, open),
                None if free == 0 => {
                    return Err(format!(
                        "the shard holds {open} connections (connections_per_shard_max {}), all of them past their \
                         handshake and busy",
                        self.limits.connections_max
                    ))
                }
                None => {}
            }
        }
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let control =
            Rc::new(Control::new(id, peer.map(|p| p.to_string()).unwrap_or_default(), ip, self.buffers.clone()));
        self.open.borrow_mut().insert(id, control.clone());
        if let Some(ip) = ip {
            *self.per_peer.borrow_mut().entry(ip).or_insert(0) += 1;
        }
        Ok(Slot { slots: self.clone(), control })
    }

    fn oldest_handshaking(&self) -> Option<Rc<Control>> {
        self.open.borrow().values().filter(|c| !c.handshaken.get()).min_by_key(|c| (c.opened_at, c.id)).cloned()
    }

    fn longest_idle(&self) -> Option<Rc<Control>> {
        self.open.borrow().values().filter(|c| !c.busy.get()).min_by_key(|c| (c.last_request.get(), c.id)).cloned()
    }

    fn evict(&self, victim: &Control, open: usize) {
        let (what, since) = if victim.handshaken.get() {
            ("idle without producer or consumer", victim.last_request.get())
        } else {
            ("still in its handshake", victim.opened_at)
        };
        let reason = format!(
            "evicted to make room for a new connection: {what} for {} ms while the shard holds {open} of \
             {} connections (reserve {})",
            since.elapsed().as_millis(),
            self.limits.connections_max,
            self.limits.reserve
        );
        self.remove(victim.id);
        victim.kill(reason);
    }

    /// Frees connection `id`'s slot if it still holds one.
    fn remove(&self, id: u64) {
        let Some(c) = self.open.borrow_mut().remove(&id) else { return };
        if let Some(ip) = c.ip {
            let mut per_peer = self.per_peer.borrow_mut();
            let held = per_peer.get_mut(&ip);
            assert!(held.as_ref().is_some_and(|n| **n > 0), "a peer's connection released twice");
            if let Some(n) = held {
                *n -= 1;
                if *n == 0 {
                    per_peer.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn addr(last: u8, port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([10, 0, 0, last], port)))
    }

    fn slots(connections_max: usize, reserve: usize, per_peer_max: usize) -> Rc<Slots> {
        Rc::new(Slots::new(SlotLimits { connections_max, reserve, per_peer_max }, Rc::new(Buffers::new(1 << 20))))
    }

    /// Goal: near the limit, connections still in their handshake go first
    /// (oldest first), then idle ones; busy ones are never evicted; a full
    /// shard of busy connections refuses.
    /// Method: a shard of 4 slots with a reserve of 2, filled step by step.
    #[test]
    fn handshake_less_connections_are_evicted_first() {
        let s = slots(4, 2, 100);
        let a = s.admit(addr(1, 1)).unwrap_or_else(|e| panic!("{e}"));
        a.control.handshake_done();
        a.control.set_busy(true);
        let b = s.admit(addr(1, 2)).unwrap_or_else(|e| panic!("{e}"));
        b.control.handshake_done();
        // Two free slots, the reserve: a newcomer evicts a handshaking one,
        // but there is none yet.
        let c = s.admit(addr(1, 3)).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.control.killed().is_none());
        // One free slot: the oldest handshaking connection (c) makes room.
        let d = s.admit(addr(1, 4)).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.control.killed().is_some_and(|r| r.contains("handshake")), "{:?}", c.control.killed());
        assert_eq!(s.open(), 3);
        drop(c);
        assert_eq!(s.open(), 3, "an evicted connection freed its slot twice");
        d.control.handshake_done();
        d.control.set_busy(true);
        let e = s.admit(addr(1, 5)).unwrap_or_else(|e| panic!("{e}"));
        e.control.handshake_done();
        e.control.set_busy(true);
        assert_eq!(s.open(), 4);
        // Full: no handshaking connection, so the idle one (b) goes.
        let f = s.admit(addr(1, 6)).unwrap_or_else(|e| panic!("{e}"));
        assert!(b.control.killed().is_some_and(|r| r.contains("idle")));
        assert!(a.control.killed().is_none() && d.control.killed().is_none());
        f.control.handshake_done();
        f.control.set_busy(true);
        // Full of busy connections: refused.
        assert!(s.admit(addr(1, 7)).is_err());
        drop(a);
        assert!(s.admit(addr(1, 8)).is_ok());
    }

    /// Goal: one address holds at most `per_peer_max` connections; closing
    /// one lets it open another; other addresses are unaffected.
    #[test]
    fn one_peer_holds_at_most_its_limit() {
        let s = slots(100, 0, 2);
        let a = s.admit(addr(1, 1)).unwrap_or_else(|e| panic!("{e}"));
        let _b = s.admit(addr(1, 2)).unwrap_or_else(|e| panic!("{e}"));
        assert!(s.admit(addr(1, 3)).is_err_and(|e| e.contains("per peer")));
        assert!(s.admit(addr(2, 1)).is_ok());
        drop(a);
        assert!(s.admit(addr(1, 4)).is_ok());
    }
}
