//! Reading BPF maps with as few system calls as the kernel allows: hash
//! maps in batches (`BPF_MAP_LOOKUP_BATCH` and
//! `BPF_MAP_LOOKUP_AND_DELETE_BATCH`, Linux 5.6), one call per few hundred
//! entries where an iteration costs two or three per entry (next key,
//! lookup, delete); a per-CPU array in one call; a stack trace read and
//! deleted in one call (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`). The last two
//! depend on the kernel: their callers fall back to a call per entry. At
//! every drain that is the difference between a few and a few thousand
//! system calls. aya has none of these, hence this.

use std::{
    io,
    os::fd::{AsFd, AsRawFd},
};

use aya::{Pod, maps::MapData};

const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;
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
        // values and at two u64 tokens, all alive for the call.
        let error = unsafe { batch_call(command, &mut attr) };
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

/// Runs one batch command; the error it returned, if any (`attr.count`
/// then says how many entries it wrote).
///
/// # Safety
/// `attr`'s pointers name buffers for `attr.count` keys and values of the
/// map's sizes and two position tokens, alive for the call: the kernel reads
/// `size_of::<BatchAttr>()` bytes of `attr` and writes through them.
unsafe fn batch_call(command: libc::c_long, attr: &mut BatchAttr) -> Option<io::Error> {
    // SAFETY: the caller's promise above.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_mut(attr),
            size_of::<BatchAttr>() as libc::c_uint,
        )
    };
    (result < 0).then(io::Error::last_os_error)
}

/// The `BPF_MAP_*_ELEM` members of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

// The kernel reads these many bytes of each: its `union bpf_attr` members
// for the two commands, laid out as above.
const _: () = assert!(size_of::<ElemAttr>() == 32 && size_of::<BatchAttr>() == 56);

/// What [`take`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Read into the value, and deleted.
    Read,
    /// No such key.
    Absent,
    /// This kernel cannot read and delete this map's entries in one call
    /// (stack-trace maps: this VM's 6.18 can, older kernels answer
    /// ENOTSUPP): read and delete them apart.
    Unsupported,
}

/// Reads the value of `key` into `value` and deletes the entry, in one
/// system call.
///
/// # Safety
/// `K` and `V` are the map's key and value: the kernel reads `key_size`
/// bytes of `key` and writes `value_size` bytes into `value`.
pub unsafe fn take<K: Pod, V: Pod>(map: &MapData, key: &K, value: &mut V) -> io::Result<Taken> {
    let mut attr = ElemAttr {
        map_fd: map.fd().as_fd().as_raw_fd() as u32,
        key: std::ptr::from_ref(key) as u64,
        value: std::ptr::from_mut(value) as u64,
        ..ElemAttr::default()
    };
    // SAFETY: the attribute points at a key and a value of the map's sizes
    // (the caller's promise), alive for the call; the kernel reads
    // `size_of::<ElemAttr>()` bytes of `attr` and writes one value.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_AND_DELETE_ELEM,
            &raw mut attr,
            size_of::<ElemAttr>() as libc::c_uint,
        )
    };
    if result == 0 {
        return Ok(Taken::Read);
    }
    let error = io::Error::last_os_error();
    // ENOTSUPP (524, the kernel's own) for map types it does not do this
    // for; EINVAL before the command existed.
    const ENOTSUPP: i32 = 524;
    match error.raw_os_error() {
        Some(libc::ENOENT) => Ok(Taken::Absent),
        Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP) => Ok(Taken::Unsupported),
        _ => Err(error),
    }
}

/// Every entry of a per-CPU array of u64 (keys 0..`entries`), `cpus`
/// values each, entry after entry into `values` (cleared first; `keys`
/// holds the keys read): one system call where a lookup per entry took
/// `entries`.
///
/// # Safety
/// `map` is a per-CPU array of u64 of at least `entries` entries, and
/// `cpus` the possible CPUs: the kernel writes 8 bytes per possible CPU for
/// each entry.
pub unsafe fn read_per_cpu_array(
    map: &MapData,
    entries: u32,
    cpus: usize,
    keys: &mut Vec<u32>,
    values: &mut Vec<u64>,
) -> io::Result<()> {
    let total = entries as usize;
    values.clear();
    values.resize(total * cpus, 0);
    keys.clear();
    keys.resize(total, 0);
    let fd = map.fd().as_fd().as_raw_fd() as u32;
    // An array's position token is its last key read (u32; u64 leaves room).
    let mut position: u64 = 0;
    let mut next: u64 = 0;
    let mut done = 0;
    while done < total {
        let mut attr = BatchAttr {
            in_batch: if done > 0 { &raw const position as u64 } else { 0 },
            out_batch: &raw mut next as u64,
            // SAFETY (of the pointers): both vectors hold `total` entries,
            // `done` of them written.
            keys: keys.as_mut_ptr().wrapping_add(done) as u64,
            values: values.as_mut_ptr().wrapping_add(done * cpus) as u64,
            count: (total - done) as u32,
            map_fd: fd,
            ..BatchAttr::default()
        };
        // SAFETY: valid buffers for `count` keys and values (`cpus` u64
        // each, the kernel's per-CPU value of a u64 array: the caller's
        // promise) and two tokens, alive for the call.
        let error = unsafe { batch_call(BPF_MAP_LOOKUP_BATCH, &mut attr) };
        done += (attr.count as usize).min(total - done);
        match error.as_ref().and_then(io::Error::raw_os_error) {
            None => position = next,
            Some(libc::ENOENT) if done == total => break,
            _ => return Err(error.unwrap_or_else(|| io::Error::other("batch read failed"))),
        }
        if attr.count == 0 {
            return Err(io::Error::other("a batch read of an array returned nothing"));
        }
    }
    // Keys come in order for an array; checked, as a wrong order would
    // credit one counter's events to another.
    if keys.iter().enumerate().any(|(index, &key)| key as usize != index) {
        return Err(io::Error::other(
            "a batch read of an array returned its keys out of order",
        ));
    }
    Ok(())
}
