use super::*;
use nix::poll::{PollFd, PollFlags, poll};
use profiler_common::UnwindRow;
use std::os::fd::AsFd;

#[test]
fn frames_and_descriptors_cross_a_socket_pair() {
    let (a, b) = socket_pair().expect("socketpair");
    let file = std::fs::File::open("/proc/self/exe").expect("our own binary");
    let request = Request {
        file: Some(FileIdentity {
            dev: 1,
            inode: 2,
            size: 3,
            mtime_ns: -4,
        }),
        offsets: vec![1, 2, 3],
        debug_file_lines: true,
        ..Request::default()
    };
    send_frame(a.as_fd(), &request, Some(file.as_fd())).expect("send");
    let (body, fd) = recv_frame(b.as_fd(), MAX_REQUEST_BYTES, || Ok(())).expect("receive");
    assert_eq!(Request::decode(&*body).expect("decode"), request);
    assert!(fd.is_some(), "the descriptor should arrive with the frame");
}

/// An unwind table crosses as one copy in the daemon: its rows are read in
/// place from the frame received, and the frame is encoded without a second
/// buffer.
#[test]
fn an_unwind_table_is_decoded_in_place_from_its_frame() {
    let rows: Vec<UnwindRow> = (0..65536)
        .map(|pc| UnwindRow {
            pc,
            cfa_offset: 8,
            rbp_offset: 0,
            rules: 0,
        })
        .collect();
    let response = Response {
        unwind_table: Some(UnwindTable {
            rows: UnwindTable::encode_rows(&rows),
            ..UnwindTable::default()
        }),
        ..Response::default()
    };
    let (a, b) = socket_pair().expect("socketpair");
    // Sent from a thread: the frame (512 KiB) is larger than the socket's
    // buffer. Each side owns its end: a failed send closes it and the
    // receive fails, a failed receive closes it and the send fails.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let a = a;
            send_frame(a.as_fd(), &response, None).expect("send");
        });
        let b = b;
        let body = recv_frame_without_fd(b.as_fd(), MAX_RESPONSE_BYTES, || Ok(())).expect("receive");
        let frame = body.as_ptr_range();
        let frame = frame.start as usize..frame.end as usize;
        let decoded = decode_response(body).expect("decode");
        let table = decoded.unwind_table.expect("the table");
        let rows_at = table.rows.as_ptr() as usize;
        assert!(
            frame.contains(&rows_at) && frame.contains(&(rows_at + table.rows.len() - 1)),
            "the rows should be read in place from the frame {frame:#x?}, not copied to {rows_at:#x}"
        );
        assert_eq!(table.rows, response.unwind_table.as_ref().expect("sent").rows);
    });
}

/// Whether every write end of the pipe `reader` reads from is closed.
fn writers_gone(reader: &std::io::PipeReader) -> bool {
    let mut pollfd = [PollFd::new(reader.as_fd(), PollFlags::POLLIN)];
    poll(&mut pollfd, 0u8).expect("poll") == 1
        && pollfd[0]
            .revents()
            .is_some_and(|events| events.contains(PollFlags::POLLHUP))
}

#[test]
fn the_daemon_side_never_installs_a_descriptor() {
    // The write end of a pipe, sent then closed here: the pipe hangs up
    // once no copy of it is left.
    let send = |socket: &OwnedFd| {
        let (reader, writer) = std::io::pipe().expect("pipe");
        send_frame(socket.as_fd(), &Response::default(), Some(writer.as_fd())).expect("send");
        reader
    };
    let (a, b) = socket_pair().expect("socketpair");
    // Taken (the worker's side), the copy received keeps the pipe up.
    let reader = send(&a);
    let (_, fd) = recv_frame(b.as_fd(), MAX_RESPONSE_BYTES, || Ok(())).expect("receive");
    assert!(fd.is_some() && !writers_gone(&reader));
    drop(fd);
    assert!(writers_gone(&reader));
    // Refused (the daemon's side), the kernel closed it unseen.
    let reader = send(&a);
    let body = recv_frame_without_fd(b.as_fd(), MAX_RESPONSE_BYTES, || Ok(())).expect("receive");
    assert!(body.is_empty(), "an empty response");
    assert!(writers_gone(&reader), "the descriptor sent was installed here");
}

#[test]
fn oversized_frames_are_refused() {
    let (a, b) = socket_pair().expect("socketpair");
    let request = Request {
        file: None,
        offsets: (0..1000).collect(),
        ..Request::default()
    };
    send_frame(a.as_fd(), &request, None).expect("send");
    let result = recv_frame(b.as_fd(), 16, || Ok(()));
    assert!(
        matches!(result, Err(ProtocolError::TooLarge(_))),
        "got {result:?}"
    );
}

#[test]
fn bounded_cuts_on_a_character_boundary() {
    assert_eq!(bounded("héllo".into(), 2), "h");
    assert_eq!(bounded("abc".into(), 10), "abc");
}

#[test]
fn causes_are_printed_once() {
    let decode = Response::decode(&[0xff_u8][..]).expect_err("one 0xff byte is not a message");
    crate::error::assert_each_cause_once(&ProtocolError::Decode(decode));
    let io = io::Error::from(io::ErrorKind::BrokenPipe);
    crate::error::assert_each_cause_once(&ProtocolError::Io(io));
}
