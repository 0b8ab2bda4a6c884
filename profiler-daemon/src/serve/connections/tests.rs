use super::*;

fn limits(max_connections: usize) -> ConnectionLimits {
    ConnectionLimits {
        max_connections,
        header_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(60),
    }
}

/// Stands in for a connection's task: closes when asked to make room
/// (unless busy), as `accept.rs` does.
fn hold(admission: Admission) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            admission.slot().changed().await;
            if admission.slot().take_eviction() {
                admission.table().count_closed(CloseReason::Evicted);
                return;
            }
        }
    })
}

fn closed(table: &ConnectionTable, reason: CloseReason) -> u64 {
    let index = CloseReason::ALL
        .iter()
        .position(|&r| r == reason)
        .expect("a reason");
    table.stats().closed[index]
}

#[tokio::test]
async fn a_slot_is_on_the_header_clock_then_busy_then_idle_then_on_the_header_clock_again() {
    let table = Arc::new(ConnectionTable::new(limits(4)));
    let admission = table.admit().await.expect("room");
    let slot = admission.slot();
    let limits = table.limits();
    let (_, reason) = slot.deadline(&limits).expect("a new connection has a deadline");
    assert_eq!(reason, CloseReason::HeaderTimeout);
    slot.on_read();
    assert_eq!(
        slot.deadline(&limits).map(|(_, reason)| reason),
        Some(CloseReason::HeaderTimeout),
        "bytes of the first request do not restart its header clock"
    );

    let guard = slot.begin_request();
    assert!(slot.deadline(&limits).is_none(), "no timeout while in flight");
    slot.on_read();
    assert!(
        slot.deadline(&limits).is_none(),
        "a request body read is no new request"
    );
    drop(guard);
    let (idle_until, reason) = slot.deadline(&limits).expect("idle");
    assert_eq!(reason, CloseReason::IdleTimeout);
    assert!(idle_until > Instant::now() + Duration::from_secs(50));

    slot.set_write_blocked(true);
    assert!(slot.deadline(&limits).is_none(), "a stuck response write is busy");
    slot.set_write_blocked(false);
    assert_eq!(
        slot.deadline(&limits).map(|(_, reason)| reason),
        Some(CloseReason::IdleTimeout)
    );
    slot.on_read();
    let (headers_until, reason) = slot.deadline(&limits).expect("waiting for headers");
    assert_eq!(
        reason,
        CloseReason::HeaderTimeout,
        "a byte after idling starts the header clock"
    );
    assert!(headers_until <= Instant::now() + Duration::from_millis(500));
}

#[tokio::test]
async fn at_the_limit_the_longest_idle_connection_makes_room() {
    let table = Arc::new(ConnectionTable::new(limits(3)));
    let first = table.admit().await.expect("room");
    let first_slot = first.slot().clone();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let second = table.admit().await.expect("room");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let third = table.admit().await.expect("room");
    // The oldest one is busy: the second is the longest idle.
    let _in_flight = first_slot.begin_request();
    let first = hold(first);
    let second = hold(second);
    let third = hold(third);

    let fourth = table.admit().await.expect("an idle connection made room");
    assert_eq!(closed(&table, CloseReason::Evicted), 1);
    tokio::time::timeout(Duration::from_secs(1), second)
        .await
        .expect("the second (longest idle) connection was the one to close")
        .expect("its task");
    assert!(!first.is_finished(), "the busy connection keeps its place");
    assert!(!third.is_finished(), "the younger idle connection stays");
    assert_eq!(table.stats().open, 3);
    drop(fourth);
    assert_eq!(table.stats().open, 2);
}

#[tokio::test]
async fn when_every_connection_is_busy_a_new_one_is_refused() {
    let table = Arc::new(ConnectionTable::new(limits(2)));
    let a = table.admit().await.expect("room");
    let b = table.admit().await.expect("room");
    let _guards = (a.slot().begin_request(), b.slot().begin_request());
    let (a, b) = (hold(a), hold(b));
    assert!(table.admit().await.is_none(), "no room and nobody idle");
    assert_eq!(closed(&table, CloseReason::Refused), 1);
    assert_eq!(closed(&table, CloseReason::Evicted), 0);
    assert_eq!(table.stats().open, 2);
    assert!(!a.is_finished() && !b.is_finished());
}

#[tokio::test]
async fn a_connection_that_became_busy_before_obeying_keeps_its_place() {
    let table = Arc::new(ConnectionTable::new(limits(1)));
    let only = table.admit().await.expect("room");
    let slot = only.slot().clone();
    slot.request_eviction();
    let guard = slot.begin_request();
    assert!(!slot.take_eviction(), "busy: the request is not cut");
    drop(guard);
    assert!(!slot.take_eviction(), "the request was withdrawn, not postponed");
}
