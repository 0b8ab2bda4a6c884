//! Reading BPF hash maps in batches (`BPF_MAP_LOOKUP_BATCH` and
//! `BPF_MAP_LOOKUP_AND_DELETE_BATCH`, Linux 5.6): one system call per few
//! hundred entries, where an iteration costs two or three per entry (next
//! key, lookup, delete). At every drain that is the difference between a few
//! and a few thousand system calls. aya has no batch API, hence this.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

use aya::{Pod, maps::MapData};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_LOOKUP_AND_DELETE_BATCH: libc::c_long = 25;
/// Entries asked for per call; a bucket holding more makes the kernel ask
/// for a larger batch (ENOSPC), and the batch grows up to this bound.
const FIRST_BATCH: usize = 512;
const MAX_BATCH: usize = 1 << 20;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of a hash map, appended to `keys` and `values` (cleared
/// first); with `delete`, each entry read is deleted in the same call. On
/// an error the entries read so far are kept (and, with `delete`, gone from
/// the map).
pub fn read_all<K: Pod, V: Pod>(
    map: &MapData,
    delete: bool,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
) -> io::Result<()> {
    keys.clear();
    values.clear();
    let command = if delete {
        BPF_MAP_LOOKUP_AND_DELETE_BATCH
    } else {
        BPF_MAP_LOOKUP_BATCH
    };
    let fd = map.fd().as_fd().as_raw_fd() as u32;
    // Hash maps use a bucket index (u32) as the position token; u64 leaves room.
    let mut position: u64 = 0;
    let mut next: u64 = 0;
    let mut started = false;
    let mut batch = FIRST_BATCH;
    loop {
        let at = keys.len();
        keys.reserve(batch);
        values.reserve(batch);
        let mut attr = BatchAttr {
            in_batch: if started { &raw const position as u64 } else { 0 },
            out_batch: &raw mut next as u64,
            // SAFETY (of the pointers): `reserve` made room for `batch`
            // entries past `at` in both vectors.
            keys: keys.as_mut_ptr().wrapping_add(at) as u64,
            values: values.as_mut_ptr().wrapping_add(at) as u64,
            count: batch as u32,
            map_fd: fd,
            ..BatchAttr::default()
        };
        // SAFETY: the attribute points at valid buffers for `count` keys and
        // values and at two u64 tokens, all alive for the call; the kernel
        // reads `size_of::<BatchAttr>()` bytes of `attr` and writes `count`.
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                command,
                &raw mut attr,
                size_of::<BatchAttr>() as libc::c_uint,
            )
        };
        let error = (result < 0).then(io::Error::last_os_error);
        let read = (attr.count as usize).min(batch);
        // SAFETY: the kernel wrote `read` whole entries (Pod: any bytes are
        // valid) into the reserved space.
        unsafe {
            keys.set_len(at + read);
            values.set_len(at + read);
        }
        match error.as_ref().and_then(io::Error::raw_os_error) {
            None => {
                position = next;
                started = true;
            }
            // The end of the map.
            Some(libc::ENOENT) => return Ok(()),
            // One bucket holds more entries than asked for: ask for more.
            Some(libc::ENOSPC) if read == 0 && batch < MAX_BATCH => batch *= 2,
            _ => return Err(error.unwrap_or_else(|| io::Error::other("batch read failed"))),
        }
    }
}
