//! A Rust release build without frame pointers: `rust_hot_path`, reached
//! from main through two named functions, spends its time in std's sorting,
//! hashing and formatting. Sorting and hashing are generic, compiled into
//! this crate without frame pointers; the prebuilt std of recent toolchains
//! (formatting, the runtime around main) has them: a mixed stack, as real
//! Rust programs have.
//! Usage: rust_nofp SECONDS

use std::{collections::HashMap, fmt::Write as _, hint::black_box, time::Instant};

#[inline(never)]
fn rust_hot_path(round: u64) -> u64 {
    let mut values: Vec<u64> = (0..12_000u64)
        .map(|i| (i ^ round).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    values.sort_unstable();
    let mut counts: HashMap<u64, u32> = HashMap::new();
    for value in &values {
        *counts.entry(value % 4099).or_default() += 1;
    }
    let mut text = String::new();
    for value in values.iter().step_by(4) {
        let _ = write!(text, "{value:x},");
    }
    black_box(text.len() as u64 + counts.len() as u64 + values[values.len() / 2])
}

#[inline(never)]
fn rust_stage_two(round: u64) -> u64 {
    let out = rust_hot_path(round);
    black_box(out).wrapping_add(1)
}

#[inline(never)]
fn rust_stage_one(seconds: f64) -> u64 {
    let until = Instant::now() + std::time::Duration::from_secs_f64(seconds);
    let mut acc = 0u64;
    let mut round = 0u64;
    while Instant::now() < until {
        acc = acc.wrapping_add(rust_stage_two(round));
        round += 1;
    }
    black_box(acc)
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(5.0);
    black_box(rust_stage_one(seconds));
}
