//! The cross-shard mesh: one bounded single-producer channel per ordered pair
//! of shards (glommio shared channels), created once at start.
//!
//! Sending never blocks the caller: each peer has a local queue drained, in
//! order, by one pump task, so requests from one shard to another keep their
//! order and a full channel only delays that pump. Memory is bounded above
//! this layer (connections stop reading when their in-flight bytes pass a
//! limit; dispatch is bounded by flow permits).

use super::routing::{Op, OpResult};
use crate::api::ConsumerEvent;
use crate::error::CoreError;
use glommio::channels::local_channel::{self, LocalSender};
use glommio::channels::shared_channel::{ConnectedReceiver, SharedReceiver, SharedSender};

/// Capacity of each cross-shard channel, in messages.
pub const MESH_CHANNEL_CAPACITY: usize = 1024;

/// How often the connect handshake is polled again even without a wake-up.
const CONNECT_REPOLL: std::time::Duration = std::time::Duration::from_millis(10);

/// Polls `fut` at least every `tick`, whether or not it was woken.
///
/// glommio's shared-channel connect registers a connection waker that the
/// peer executor must wake across threads; a start was seen (twice, under
/// load, after kill -9 and restart) where one shard never got past start-up
/// while its peer had connected — the signature of a lost wake-up in that
/// handshake (compare glommio issue 555, full meshes hanging at join). The
/// connect future re-checks the peer's state on every poll, so polling it
/// again on a timer turns a lost wake-up into a 10 ms delay instead of a hang.
async fn repoll<F: std::future::Future>(fut: F, tick: std::time::Duration) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    loop {
        let timer = Box::pin(glommio::timer::sleep(tick));
        if let futures::future::Either::Left((out, _)) = futures::future::select(fut.as_mut(), timer).await {
            return out;
        }
    }
}

/// A message between shards.
#[derive(Debug)]
pub(crate) enum MeshMsg {
    Request { from: u32, req_id: u64, op: Op },
    Reply { req_id: u64, result: OpResult },
    Event { sink: u64, event: ConsumerEvent },
}

const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<MeshMsg>();
    assert_send::<CoreError>();
};

/// One shard's unconnected channel ends, handed to its executor at start.
pub struct MeshEnds {
    pub(crate) senders: Vec<(u32, SharedSender<MeshMsg>)>,
    pub(crate) receivers: Vec<(u32, SharedReceiver<MeshMsg>)>,
}

/// Creates the channels of a full mesh of `n` shards; element i goes to shard i.
pub fn build_mesh(n: u32) -> Vec<MeshEnds> {
    let mut ends: Vec<MeshEnds> = (0..n).map(|_| MeshEnds { senders: Vec::new(), receivers: Vec::new() }).collect();
    for from in 0..n {
        for to in 0..n {
            if from == to {
                continue;
            }
            let (tx, rx) = glommio::channels::shared_channel::new_bounded(MESH_CHANNEL_CAPACITY);
            ends[from as usize].senders.push((to, tx));
            ends[to as usize].receivers.push((from, rx));
        }
    }
    ends
}

/// This shard's sending side of the mesh.
pub(crate) struct Mesh {
    outs: Vec<Option<LocalSender<MeshMsg>>>,
}

impl Mesh {
    /// Connects every channel end (all shards must do this concurrently, or
    /// the handshakes wait for each other), starts the pumps, and returns the
    /// receivers to be drained by the shard.
    pub(crate) async fn connect(n: u32, ends: MeshEnds) -> (Mesh, Vec<(u32, ConnectedReceiver<MeshMsg>)>) {
        let senders =
            futures::future::join_all(ends.senders.into_iter().map(|(to, s)| async move { (to, s.connect().await) }));
        let receivers = futures::future::join_all(
            ends.receivers.into_iter().map(|(from, r)| async move { (from, r.connect().await) }),
        );
        let (senders, receivers) = repoll(futures::future::join(senders, receivers), CONNECT_REPOLL).await;
        let mut outs: Vec<Option<LocalSender<MeshMsg>>> = (0..n).map(|_| None).collect();
        for (to, connected) in senders {
            let (tx, rx) = local_channel::new_unbounded::<MeshMsg>();
            glommio::spawn_local(async move {
                while let Some(msg) = rx.recv().await {
                    if connected.send(msg).await.is_err() {
                        // The peer is gone (shutting down); drop the rest.
                        break;
                    }
                }
            })
            .detach();
            outs[to as usize] = Some(tx);
        }
        (Mesh { outs }, receivers)
    }

    pub(crate) fn send(&self, to: u32, msg: MeshMsg) {
        match self.outs.get(to as usize).and_then(|o| o.as_ref()) {
            Some(tx) => {
                let _ = tx.try_send(msg);
            }
            None => tracing::error!(to, "mesh send to an unknown shard dropped"),
        }
    }
}
