//! The attacker of tests/hostile_connections.rs, run as an unprivileged
//! user: opens COUNT TCP connections to ADDR, sends nothing on them, and
//! holds them for SECONDS (from its start), reopening up to REOPEN_PER_SECOND
//! of those the server closes, so the server stays full of idle clients.
//!
//! Usage: hold_connections ADDR COUNT SECONDS REOPEN_PER_SECOND
//!
//! Standard output, one line each: `opened OK failed FAILED ms MS` once the
//! COUNT connects are done, then every second
//! `holding alive ALIVE closed CLOSED reopened REOPENED`.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    os::fd::AsRawFd,
    process::ExitCode,
    time::{Duration, Instant},
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const POLL_INTERVAL: Duration = Duration::from_millis(100);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [addr, count, seconds, reopen] => (
            addr.parse::<SocketAddr>().ok(),
            count.parse::<usize>().ok(),
            seconds.parse::<u64>().ok(),
            reopen.parse::<usize>().ok(),
        ),
        _ => (None, None, None, None),
    };
    let (Some(addr), Some(count), Some(seconds), Some(reopen_per_second)) = parsed else {
        eprintln!("usage: hold_connections ADDR COUNT SECONDS REOPEN_PER_SECOND");
        return ExitCode::from(2);
    };
    let limit = match raise_fd_limit() {
        Ok(limit) => limit,
        Err(err) => {
            eprintln!("hold_connections: raising RLIMIT_NOFILE: {err}");
            return ExitCode::from(2);
        }
    };
    if limit < count as u64 + 64 {
        eprintln!("hold_connections: RLIMIT_NOFILE hard limit {limit} is below {count} connections + 64");
        return ExitCode::from(2);
    }
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let mut held: Vec<Option<TcpStream>> = Vec::with_capacity(count);
    let mut failed = 0usize;
    while held.len() < count && Instant::now() < end {
        match connect(addr) {
            Some(stream) => held.push(Some(stream)),
            None => {
                failed += 1;
                held.push(None);
            }
        }
    }
    let opened = held.iter().flatten().count();
    say(&format!(
        "opened {opened} failed {failed} ms {}",
        started.elapsed().as_millis()
    ));

    let (mut closed, mut reopened, mut attempted) = (0usize, 0usize, 0usize);
    let holding = Instant::now();
    let mut next_report = holding + Duration::from_secs(1);
    while Instant::now() < end {
        closed += reap_closed(&mut held);
        // Paced: REOPEN_PER_SECOND since the hold began, no catching up.
        let due = (holding.elapsed().as_secs_f64() * reopen_per_second as f64) as usize;
        for slot in held
            .iter_mut()
            .filter(|slot| slot.is_none())
            .take(due - attempted)
        {
            if let Some(stream) = connect(addr) {
                *slot = Some(stream);
                reopened += 1;
            }
        }
        attempted = due;
        if Instant::now() >= next_report {
            let alive = held.iter().flatten().count();
            say(&format!(
                "holding alive {alive} closed {closed} reopened {reopened}"
            ));
            next_report += Duration::from_secs(1);
        }
    }
    ExitCode::SUCCESS
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn connect(addr: SocketAddr) -> Option<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).ok()?;
    stream.set_nonblocking(true).ok()?;
    Some(stream)
}

/// Drops the connections the server closed and returns how many; one round
/// per poll interval, so that the attack costs connections, not CPU.
fn reap_closed(held: &mut [Option<TcpStream>]) -> usize {
    let (indices, mut pollfds): (Vec<usize>, Vec<libc::pollfd>) = held
        .iter()
        .enumerate()
        .filter_map(|(index, slot)| {
            let fd = slot.as_ref()?.as_raw_fd();
            let events = libc::POLLIN | libc::POLLRDHUP;
            Some((
                index,
                libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                },
            ))
        })
        .unzip();
    std::thread::sleep(POLL_INTERVAL);
    if pollfds.is_empty() {
        return 0;
    }
    // SAFETY: poll reads and writes exactly `pollfds.len()` structs of the
    // vector we own, whose descriptors stay open for the call.
    let ready = unsafe { libc::poll(pollfds.as_mut_ptr(), pollfds.len() as libc::nfds_t, 0) };
    if ready <= 0 {
        return 0;
    }
    let mut closed = 0;
    for (&index, polled) in indices
        .iter()
        .zip(&pollfds)
        .filter(|(_, polled)| polled.revents != 0)
    {
        let Some(stream) = held[index].as_mut() else {
            continue;
        };
        let mut buf = [0u8; 512];
        let gone = match stream.read(&mut buf) {
            Ok(0) => true,
            Ok(_) => polled.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0,
            Err(err) => err.kind() != ErrorKind::WouldBlock,
        };
        if gone {
            held[index] = None;
            closed += 1;
        }
    }
    closed
}

/// Soft RLIMIT_NOFILE up to the hard limit (no privilege needed); returns it.
fn raise_fd_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads the struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(limit.rlim_cur)
}
