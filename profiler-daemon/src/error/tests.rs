//! Every error enum of the daemon whose variants carry a cause, one instance
//! of each such variant: each cause is printed once, and none is lost.
//! (ProtocolError is checked in its own module, which is private.)

use std::{error::Error, io};

use aya::{EbpfError, maps::MapError, programs::ProgramError, sys::SyscallError};

use super::{Chain, assert_each_cause_once};
use crate::{
    collect::CollectError,
    config::ConfigError,
    daemon::DaemonError,
    pipeline::PipelineError,
    record::RecordError,
    serve::{ListenAddress, access::PeerError},
    store::StoreClosed,
    symbolize::worker::{UnwindTableError, WorkerError},
};

fn denied() -> io::Error {
    io::Error::from_raw_os_error(libc::EPERM)
}

fn syscall(call: &'static str) -> SyscallError {
    SyscallError {
        call,
        io_error: denied(),
    }
}

fn collect_errors() -> Vec<CollectError> {
    vec![
        CollectError::Load(EbpfError::BtfSourceError(denied())),
        CollectError::Program {
            name: "sample",
            source: ProgramError::SyscallError(syscall("bpf_prog_load")),
        },
        CollectError::AttachCpu {
            cpu: 1,
            source: ProgramError::SyscallError(syscall("perf_event_open")),
        },
        CollectError::OnlineCpus("/sys/devices/system/cpu/online", denied()),
        CollectError::Map {
            name: "COUNTS_0",
            source: MapError::SyscallError(syscall("bpf_map_update_elem")),
        },
        CollectError::Logger(aya_log::Error::MapError(MapError::SyscallError(syscall(
            "bpf_map_get_fd",
        )))),
    ]
}

fn all() -> Vec<Box<dyn Error + 'static>> {
    let mut errors: Vec<Box<dyn Error>> = vec![
        Box::new(ConfigError::Read {
            path: "/etc/profilerd.toml".into(),
            source: denied(),
        }),
        Box::new(RecordError::Write {
            path: "app.folded".into(),
            source: denied(),
        }),
        Box::new(RecordError::Store(StoreClosed)),
        Box::new(PipelineError::Thread(denied())),
        Box::new(DaemonError::Bind {
            address: ListenAddress::Tcp(([127, 0, 0, 1], 7040).into()),
            source: io::Error::from_raw_os_error(libc::EADDRINUSE),
        }),
        Box::new(DaemonError::Serve(denied())),
        Box::new(PeerError::Netlink(denied())),
        Box::new(UnwindTableError::Worker(WorkerError::Crashed)),
    ];
    for err in collect_errors() {
        errors.push(Box::new(PipelineError::Collect(err)));
    }
    for err in collect_errors() {
        errors.push(Box::new(DaemonError::Load(PipelineError::Collect(err))));
    }
    for err in collect_errors() {
        errors.push(Box::new(RecordError::Pipeline(PipelineError::Collect(err))));
    }
    errors
}

#[test]
fn every_cause_is_printed_once() {
    for err in all() {
        assert_each_cause_once(&*err);
    }
}

#[test]
fn the_chain_keeps_every_cause() {
    let denied = denied().to_string();
    for err in all() {
        if err.source().is_none() {
            continue;
        }
        let chain = Chain(&*err).to_string();
        let mut root: &dyn Error = &*err;
        while let Some(cause) = root.source() {
            root = cause;
        }
        let root = root.to_string();
        assert!(
            chain.starts_with(&err.to_string()),
            "{chain:?} does not start with the error itself"
        );
        assert!(
            chain.ends_with(&root),
            "{chain:?} does not end with the root cause {root:?}"
        );
        assert_eq!(chain.matches(&root).count(), 1, "{chain:?} repeats {root:?}");
        if root == denied {
            assert!(chain.contains("Operation not permitted"), "{chain:?}");
        }
    }
}

#[test]
fn a_config_read_error_reads_as_context_then_cause() {
    let err = ConfigError::Read {
        path: "/etc/profilerd.toml".into(),
        source: io::Error::from(io::ErrorKind::NotFound),
    };
    assert_eq!(
        Chain(&err).to_string(),
        format!(
            "reading /etc/profilerd.toml: {}",
            io::Error::from(io::ErrorKind::NotFound)
        )
    );
    // anyhow's own chain, as a program using the library would print it.
    let any = anyhow::Error::from(DaemonError::Load(PipelineError::Collect(CollectError::Map {
        name: "COUNTS_0",
        source: MapError::SyscallError(syscall("bpf_map_update_elem")),
    })));
    let text = format!("{any:#}");
    assert_eq!(text.matches("bpf_map_update_elem").count(), 1, "{text}");
    assert_eq!(text.matches("Operation not permitted").count(), 1, "{text}");
}

#[test]
fn a_dependency_that_repeats_its_cause_is_printed_once() {
    // aya formats its source and also returns it.
    let err = CollectError::Load(EbpfError::MapError(MapError::CreateError {
        name: "CONTROL".into(),
        io_error: denied(),
    }));
    let text = Chain(&err).to_string();
    assert_eq!(
        text.matches("failed to create map `CONTROL`").count(),
        1,
        "{text}"
    );
    assert!(text.ends_with(": Operation not permitted (os error 1)"), "{text}");
}
