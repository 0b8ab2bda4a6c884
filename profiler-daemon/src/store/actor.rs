//! The store's single owner: a task that applies ingests and answers queries
//! in arrival order, so a query sent after a drain's ingest sees its samples.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{Query, Store, Visible};
use crate::profile::Window;
use crate::{cgroup::Cgroup, kind::ProfileType, profile::Profile, symbolize::SymbolizedSample};

#[derive(Debug, thiserror::Error)]
#[error("the store has shut down")]
pub struct StoreClosed;

enum Request {
    Ingest {
        time_ms: u64,
        samples: Vec<SymbolizedSample>,
        acks: Vec<oneshot::Sender<u64>>,
    },
    Query {
        query: Query,
        reply: oneshot::Sender<Profile>,
    },
    HasPid {
        pid: u32,
        window: Window,
        visible: Visible,
        profile_type: ProfileType,
        reply: oneshot::Sender<bool>,
    },
    Cgroups {
        visible: Visible,
        reply: oneshot::Sender<Vec<Arc<Cgroup>>>,
    },
    EntriesIn {
        window: Window,
        profile_type: ProfileType,
        reply: oneshot::Sender<usize>,
    },
}

#[derive(Clone)]
pub struct StoreHandle {
    tx: mpsc::Sender<Request>,
}

/// Starts the store task on the current tokio runtime; the task's handle
/// is for its supervisor (it ends once every handle is dropped).
pub fn spawn(mut store: Store) -> (StoreHandle, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel(256);
    let task = tokio::spawn(async move {
        while let Some(request) = rx.recv().await {
            match request {
                Request::Ingest {
                    time_ms,
                    samples,
                    acks,
                } => {
                    store.ingest(time_ms, &samples);
                    for ack in acks {
                        let _ = ack.send(time_ms);
                    }
                }
                Request::Query { query, reply } => {
                    store.expire(crate::unix_now_ms());
                    let _ = reply.send(store.query(&query));
                }
                Request::HasPid {
                    pid,
                    window,
                    visible,
                    profile_type,
                    reply,
                } => {
                    let _ = reply.send(store.has_pid(pid, window, visible, profile_type));
                }
                Request::Cgroups { visible, reply } => {
                    let _ = reply.send(store.cgroups(visible));
                }
                Request::EntriesIn {
                    window,
                    profile_type,
                    reply,
                } => {
                    let _ = reply.send(store.entries_in(window, profile_type));
                }
            }
        }
    });
    (StoreHandle { tx }, task)
}

impl StoreHandle {
    /// From a blocking thread: hands over a symbolized drain made at
    /// `time_ms`; `acks` get that time once it is queryable.
    pub fn blocking_ingest(
        &self,
        time_ms: u64,
        samples: Vec<SymbolizedSample>,
        acks: Vec<oneshot::Sender<u64>>,
    ) -> Result<(), StoreClosed> {
        self.tx
            .blocking_send(Request::Ingest {
                time_ms,
                samples,
                acks,
            })
            .map_err(|_| StoreClosed)
    }

    pub async fn query(&self, query: Query) -> Result<Profile, StoreClosed> {
        self.ask(|reply| Request::Query { query, reply }).await
    }

    pub async fn has_pid(
        &self,
        pid: u32,
        window: Window,
        visible: Visible,
        profile_type: ProfileType,
    ) -> Result<bool, StoreClosed> {
        self.ask(|reply| Request::HasPid {
            pid,
            window,
            visible,
            profile_type,
            reply,
        })
        .await
    }

    /// See [`Store::cgroups`].
    pub async fn cgroups(&self, visible: Visible) -> Result<Vec<Arc<Cgroup>>, StoreClosed> {
        self.ask(|reply| Request::Cgroups { visible, reply }).await
    }

    /// An upper bound of the samples a query of `window` and `profile_type` returns.
    pub async fn entries_in(&self, window: Window, profile_type: ProfileType) -> Result<usize, StoreClosed> {
        self.ask(|reply| Request::EntriesIn {
            window,
            profile_type,
            reply,
        })
        .await
    }

    async fn ask<T>(&self, request: impl FnOnce(oneshot::Sender<T>) -> Request) -> Result<T, StoreClosed> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(request(reply)).await.map_err(|_| StoreClosed)?;
        answer.await.map_err(|_| StoreClosed)
    }
}
