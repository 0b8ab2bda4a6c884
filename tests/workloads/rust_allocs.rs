//! Rust with the system allocator (std's default: malloc and free of the
//! libc it maps), built by tests/build.rs with rustc at opt-level 3 and no
//! frame pointers. Two named functions allocate and free, one block each
//! per round, 2,000 rounds a second paced by wall time:
//!   - `rust_site_vec`: a Vec<u8> of capacity VEC_BYTES (12 KiB),
//!   - `rust_site_box`: a Box of a 4-KiB struct,
//! so their bytes go exactly 3:1. Nothing else allocates in the loop.
//! Usage: rust_allocs SECONDS

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

const BOX_BYTES: usize = 4096;
const VEC_BYTES: usize = 3 * BOX_BYTES;
const ROUNDS_PER_S: f64 = 2000.0;

struct Block {
    bytes: [u8; BOX_BYTES],
}

/// One Vec of exactly VEC_BYTES (with_capacity of u8: no rounding), freed
/// on return. black_box keeps the allocation (LLVM may drop an unused one).
#[inline(never)]
fn rust_site_vec(round: u64) -> u64 {
    let mut block: Vec<u8> = Vec::with_capacity(VEC_BYTES);
    block.push(round as u8);
    let block = black_box(block);
    block.capacity() as u64 + u64::from(block[0])
}

/// One Box of BOX_BYTES, freed on return.
#[inline(never)]
fn rust_site_box(round: u64) -> u64 {
    let mut block = Box::new(Block {
        bytes: [0; BOX_BYTES],
    });
    block.bytes[0] = round as u8;
    let block = black_box(block);
    block.bytes.len() as u64 + u64::from(block.bytes[0])
}

#[inline(never)]
fn rust_alloc_loop(seconds: f64) -> u64 {
    let started = Instant::now();
    let mut sum = 0u64;
    let mut round = 0u64;
    loop {
        let now = started.elapsed().as_secs_f64();
        if now >= seconds {
            break;
        }
        let due = (ROUNDS_PER_S * now) as u64;
        while round < due {
            sum = sum.wrapping_add(rust_site_vec(round));
            sum = sum.wrapping_add(rust_site_box(round));
            round += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    black_box(sum)
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(5.0);
    black_box(rust_alloc_loop(seconds));
}
