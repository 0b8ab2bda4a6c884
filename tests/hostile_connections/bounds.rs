//! The bounds one connection at a time: timeouts, the policy at the limit,
//! and accepts failing for want of descriptors.

use std::{
    io::{ErrorKind, Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use profilerd_tests::{
    daemon::{Daemon, get_in_background, metric},
    serial,
};

#[test]
fn silent_trickling_and_idle_connections_are_closed_by_their_timeouts() {
    let _serial = serial();
    let daemon = Daemon::start(&[
        "--http-header-timeout-ms",
        "500",
        "--http-idle-timeout-seconds",
        "2",
    ]);

    let connected = Instant::now();
    let mut silent = connect(&daemon);
    closed_within(&mut silent, Duration::from_secs(10)).expect("a connection that sends nothing is closed");
    let silent_for = connected.elapsed();
    assert!(
        silent_for >= Duration::from_millis(450),
        "closed after {silent_for:?}, before the 500 ms header timeout"
    );

    // A request line, then one header byte every 100 ms: the headers'
    // deadline does not move with the bytes.
    let connected = Instant::now();
    let mut trickle = connect(&daemon);
    let mut cut = false;
    for &byte in b"GET /metrics HTTP/1.1\r\nX-Slow: ".iter().cycle().take(100) {
        if trickle.write_all(&[byte]).is_err() || !is_open(&trickle) {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let trickled_for = connected.elapsed();
    assert!(
        cut,
        "a client trickling its headers for {trickled_for:?} was not cut"
    );
    assert!(
        trickled_for >= Duration::from_millis(450),
        "cut after {trickled_for:?}"
    );

    // Keep-alive: idle after its answer, it outlives the header timeout and
    // is closed at the idle timeout.
    let mut idle = connect(&daemon);
    assert_eq!(request(&mut idle, "/metrics"), 200);
    let answered = Instant::now();
    std::thread::sleep(Duration::from_millis(1200));
    assert!(
        is_open(&idle),
        "an idle keep-alive connection was cut before its 2 s idle timeout"
    );
    closed_within(&mut idle, Duration::from_secs(10)).expect("an idle connection is closed");
    let idle_for = answered.elapsed();
    assert!(
        idle_for >= Duration::from_millis(1900),
        "idle connection cut after {idle_for:?}"
    );

    // The first byte of a next request puts its headers on the clock.
    let mut next = connect(&daemon);
    assert_eq!(request(&mut next, "/metrics"), 200);
    std::thread::sleep(Duration::from_millis(700));
    next.write_all(b"GET /metrics HTTP/1.1\r\n")
        .expect("sending a request line");
    let started = Instant::now();
    closed_within(&mut next, Duration::from_secs(10)).expect("an unfinished second request is cut");
    let unfinished_for = started.elapsed();
    assert!(
        (Duration::from_millis(450)..Duration::from_millis(1300)).contains(&unfinished_for),
        "an unfinished second request was cut after {unfinished_for:?}: the header timeout is 500 ms, \
         the idle one (2 s from its answer) would have come 1.3 s after it"
    );

    // A request in flight is not on any clock.
    let started = Instant::now();
    let profile = daemon.get_on_new_connection("/debug/pprof/profile?seconds=3");
    assert_eq!(profile.status, 200, "{}", profile.text());
    assert!(started.elapsed() >= Duration::from_secs(3));

    let metrics = daemon.get_on_new_connection("/metrics").text();
    let closed = |reason: &str| {
        metric(
            &metrics,
            &format!("profilerd_http_connections_closed_total{{reason=\"{reason}\"}}"),
        )
    };
    assert!(
        closed("header_timeout") >= 3,
        "silent, trickling, unfinished:\n{metrics}"
    );
    assert!(
        closed("idle_timeout") >= 1,
        "the idle keep-alive connection:\n{metrics}"
    );
    assert_eq!(
        closed("evicted") + closed("refused"),
        0,
        "far below the limit:\n{metrics}"
    );
}

#[test]
fn at_the_limit_the_longest_idle_connection_goes_and_busy_ones_stay() {
    let _serial = serial();
    let daemon = Daemon::start(&["--http-max-connections", "4", "--http-header-timeout-ms", "60000"]);
    // Four silent connections fill the table, whatever the harness left idle.
    let mut idle: Vec<TcpStream> = (0..4)
        .map(|_| {
            let stream = connect(&daemon);
            std::thread::sleep(Duration::from_millis(50));
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));

    let metrics = daemon.get_on_new_connection("/metrics");
    assert_eq!(metrics.status, 200, "a scraper gets in at the limit");
    let text = metrics.text();
    assert!(metric(&text, "profilerd_http_connections") <= 4, "{text}");
    assert!(
        metric(
            &text,
            "profilerd_http_connections_closed_total{reason=\"evicted\"}"
        ) >= 1,
        "{text}"
    );
    closed_within(&mut idle[0], Duration::from_secs(2)).expect("the longest idle connection made room");
    assert!(idle[1..].iter().all(is_open), "the younger idle connections stay");

    // Four requests in flight: each takes a free slot or evicts an idle one.
    let profiles: Vec<_> = (0..4)
        .map(|_| get_in_background(daemon.url("/debug/pprof/profile?seconds=4")))
        .collect();
    for stream in &mut idle[1..] {
        closed_within(stream, Duration::from_secs(5)).expect("idle connections make room for requests");
    }
    std::thread::sleep(Duration::from_millis(300));

    // Every slot busy: a new connection is closed at once, unanswered.
    let mut refused = connect(&daemon);
    let _ = refused.write_all(b"GET /metrics HTTP/1.1\r\nHost: profilerd\r\n\r\n");
    let started = Instant::now();
    let answer = closed_within(&mut refused, Duration::from_secs(3)).expect("refused: closed at once");
    assert!(
        answer.is_empty(),
        "refused, not answered: {:?}",
        String::from_utf8_lossy(&answer)
    );
    assert!(started.elapsed() < Duration::from_secs(3));

    for profile in profiles {
        let status = profile.join().expect("a profile thread");
        assert!(
            matches!(status, Ok(200)),
            "requests in flight are never cut: {status:?}"
        );
    }
    let text = daemon.get_on_new_connection("/metrics").text();
    let closed = |reason: &str| {
        metric(
            &text,
            &format!("profilerd_http_connections_closed_total{{reason=\"{reason}\"}}"),
        )
    };
    assert!(closed("refused") >= 1, "{text}");
    assert!(closed("evicted") >= 4, "{text}");
}

#[test]
fn out_of_descriptors_the_accept_loop_backs_off_counts_and_recovers() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    let pid = daemon.pid();
    let original = nofile_limit(pid, None);
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the daemon's fds")
        .count() as u64;
    // A little room, then connections beyond it: accept(2) fails with EMFILE.
    nofile_limit(pid, Some((open + 16, original.1)));
    let held: Vec<TcpStream> = (0..100).map(|_| connect(&daemon)).collect();
    std::thread::sleep(Duration::from_millis(500));
    let cpu_before = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(3));
    let cpu = cpu_seconds(pid) - cpu_before;
    assert!(
        cpu < 0.6,
        "the daemon used {cpu:.2} s of CPU in 3 s while out of descriptors: the accept loop must back off"
    );
    assert!(
        std::path::Path::new(&format!("/proc/{pid}/fd")).exists(),
        "the daemon is alive"
    );

    drop(held);
    nofile_limit(pid, Some(original));
    let started = Instant::now();
    let text = daemon.get_on_new_connection("/metrics").text();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "serving again at once"
    );
    assert!(metric(&text, "profilerd_http_accept_errors_total") >= 1, "{text}");
    assert_eq!(daemon.get_on_new_connection("/pprof?seconds=1").status, 200);
}

fn connect(daemon: &Daemon) -> TcpStream {
    TcpStream::connect(&daemon.addr).unwrap_or_else(|err| panic!("connecting to {}: {err}", daemon.addr))
}

/// Waits up to `limit` for the daemon to close `stream` (EOF or reset);
/// returns what it sent before.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let started = Instant::now();
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("a read timeout");
    let (mut received, mut buf) = (Vec::new(), [0u8; 4096]);
    while started.elapsed() < limit {
        match stream.read(&mut buf) {
            Ok(0) => return Some(received),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(received),
        }
    }
    None
}

fn is_open(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).expect("non-blocking");
    let mut buf = [0u8; 1];
    let open = matches!(stream.peek(&mut buf), Err(err) if err.kind() == ErrorKind::WouldBlock);
    stream.set_nonblocking(false).expect("blocking");
    open
}

/// One keep-alive GET on `stream`; returns the status once the whole body
/// (Content-Length) is read.
fn request(stream: &mut TcpStream, path: &str) -> u16 {
    write!(stream, "GET {path} HTTP/1.1\r\nHost: profilerd\r\n\r\n").expect("sending a request");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("a read timeout");
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        let n = stream.read(&mut buf).expect("reading the answer");
        assert!(n > 0, "the connection closed before the answer's head");
        data.extend_from_slice(&buf[..n]);
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("an answer with a Content-Length: {head}"));
    while data.len() < head_end + length {
        let n = stream.read(&mut buf).expect("reading the body");
        assert!(n > 0, "the connection closed mid-body");
        data.extend_from_slice(&buf[..n]);
    }
    head.split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"))
}

/// The daemon's RLIMIT_NOFILE (soft, hard), set to `new` if given (a process
/// of our own uid; raising a hard limit would need CAP_SYS_RESOURCE, so the
/// test only moves the soft one).
fn nofile_limit(pid: u32, new: Option<(u64, u64)>) -> (u64, u64) {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    let new = new.map(|(soft, hard)| libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    });
    let new_ptr = new
        .as_ref()
        .map_or(std::ptr::null(), |limit| limit as *const libc::rlimit);
    // SAFETY: prlimit reads `new` (or nothing) and writes `old`, both ours.
    let status = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, new_ptr, &mut old) };
    assert_eq!(
        status,
        0,
        "prlimit on the daemon: {}",
        std::io::Error::last_os_error()
    );
    (old.rlim_cur, old.rlim_max)
}

/// User + system CPU of a process, from /proc/PID/stat.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the daemon's stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    // After the command: state is field 3, utime 14 and stime 15.
    let ticks = |index: usize| {
        fields
            .get(index - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(14) + ticks(15)) / hz
}
