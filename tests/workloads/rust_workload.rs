//! A Rust workload with a known hot function, built with frame pointers.
//! Usage: rust_workload SECONDS

mod hot {
    use std::hint::black_box;

    #[inline(never)]
    pub fn spin_rust_hot(until: std::time::Instant) -> u64 {
        let mut x = 1u64;
        while std::time::Instant::now() < until {
            for _ in 0..100_000 {
                x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        x
    }
}

fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(5.0);
    let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(seconds);
    std::hint::black_box(hot::spin_rust_hot(until));
}
