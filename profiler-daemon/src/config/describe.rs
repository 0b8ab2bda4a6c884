//! The effective settings, printed as a config file (`check-config`).

use std::path::Path;

use crate::cli::DaemonArgs;

/// The effective settings, as `check-config` prints them (valid TOML).
pub fn describe(args: &DaemonArgs) -> String {
    let s = &args.sampling;
    let h = &args.http;
    format!(
        "listen = \"{}\"\nretention_seconds = {}\nstore_max_mb = {}\nstore_user_share_percent = {}\nfrequency = {}\ndrain_interval_ms = {}\n\
         counts_map_entries = {}\nuser_stack_map_entries = {}\nkernel_stack_map_entries = {}\n\
         max_open_files = {}\nsymbolizer_memory_mb = {}\nsymbolizer_deadline_ms = {}\ndebug_file_lines = {}\n\
         unwind = \"{}\"\nunwind_table_memory_mb = {}\nunwind_table_user_share_percent = {}\n\
         off_cpu = {}\noff_cpu_sample_every = {}\noff_cpu_budget = {}\noff_cpu_min_us = {}\npython_frames = {}\nproc_root = {:?}\n\
         alloc_sample_bytes = {}\nalloc_max_processes = {}\nalloc_budget_percent = {}\nalloc_trace_comms = {:?}\nalloc_trace_units = {:?}\nalloc_trace_pids = {:?}\n\
         http_max_connections = {}\nhttp_header_timeout_ms = {}\nhttp_idle_timeout_seconds = {}\n\
         scrape_concurrency = {}\nscrape_queue = {}\nscrape_memory_mb = {}\nscrape_share_ms = {}\n\
         access_group = {:?}\naccess_token_file = {:?}\ninsecure = {}\n\
         tls_cert_file = {:?}\ntls_key_file = {:?}\ntls_client_ca_file = {:?}\n",
        args.listen,
        args.retention_seconds,
        args.store_max_mb,
        args.store_user_share_percent,
        s.frequency,
        s.drain_interval_ms,
        s.counts_map_entries,
        s.user_stack_map_entries,
        s.kernel_stack_map_entries,
        s.max_open_files,
        s.symbolizer_memory_mb,
        s.symbolizer_deadline_ms,
        s.debug_file_lines,
        s.unwind.name(),
        s.unwind_table_memory_mb,
        s.unwind_table_user_share_percent,
        s.off_cpu,
        s.off_cpu_sample_every,
        s.off_cpu_budget,
        s.off_cpu_min_us,
        !s.no_python_frames,
        s.proc_root,
        s.alloc_sample_bytes,
        s.alloc_max_processes,
        s.alloc_budget_percent,
        s.alloc_trace_comms,
        s.alloc_trace_units,
        s.alloc_trace_pids,
        h.http_max_connections,
        h.http_header_timeout_ms,
        h.http_idle_timeout_seconds,
        h.scrape_concurrency,
        h.scrape_queue,
        h.scrape_memory_mb,
        h.scrape_share_ms,
        args.access_group,
        shown(args.access_token_file.as_deref()),
        args.insecure,
        shown(args.tls.tls_cert_file.as_deref()),
        shown(args.tls.tls_key_file.as_deref()),
        shown(args.tls.tls_client_ca_file.as_deref()),
    ) + &crate::push::flags::describe(&args.push)
}

/// A file setting as `check-config` prints it: "" for none.
fn shown(path: Option<&Path>) -> String {
    path.map(|path| path.display().to_string()).unwrap_or_default()
}
