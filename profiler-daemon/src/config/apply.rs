//! Setting a parsed file's keys into the command line's arguments: a flag
//! given on the command line wins over its key.

use std::path::PathBuf;

use clap::{ArgMatches, parser::ValueSource};

use super::Config;
use crate::cli::DaemonArgs;

/// Which keys the file may set: those whose flag was not on the command line.
struct FromFile<'a>(&'a ArgMatches);

impl FromFile<'_> {
    fn allows(&self, id: &str) -> bool {
        self.0.value_source(id) != Some(ValueSource::CommandLine)
    }

    /// Sets `target` to the file's `value` of key `id`, if it has one and
    /// the command line did not set it.
    fn set<T: Copy>(&self, target: &mut T, value: Option<T>, id: &str) {
        if let (Some(value), true) = (value, self.allows(id)) {
            *target = value;
        }
    }

    /// As [`FromFile::set`], for a path where "" (as `check-config` prints
    /// none) means none.
    fn set_path(&self, target: &mut Option<PathBuf>, value: Option<&PathBuf>, id: &str) {
        if let (Some(file), true) = (value, self.allows(id)) {
            *target = (!file.as_os_str().is_empty()).then(|| file.clone());
        }
    }
}

/// Only reached with values inside `RANGES`, which all fit in u32.
fn narrow(value: Option<u64>) -> Option<u32> {
    value.map(|value| u32::try_from(value).unwrap_or(u32::MAX))
}

impl Config {
    /// Sets every key of the file into `args`, except those whose flag was
    /// given on the command line (per `matches`).
    pub fn apply(&self, args: &mut DaemonArgs, matches: &ArgMatches) {
        let from_file = FromFile(matches);
        if let (Some(listen), true) = (&self.listen, from_file.allows("listen")) {
            args.listen = listen.clone();
        }
        from_file.set(
            &mut args.retention_seconds,
            self.retention_seconds,
            "retention_seconds",
        );
        from_file.set(&mut args.store_max_mb, self.store_max_mb, "store_max_mb");
        from_file.set(
            &mut args.store_user_share_percent,
            self.store_user_share_percent,
            "store_user_share_percent",
        );
        self.apply_sampling(args, &from_file);
        self.apply_access(args, &from_file);
        self.apply_http(args, &from_file);
        if let Some(push) = &self.push {
            args.push.apply_section(push, &|id| from_file.allows(id));
        }
    }

    fn apply_sampling(&self, args: &mut DaemonArgs, from_file: &FromFile) {
        let sampling = &mut args.sampling;
        from_file.set(&mut sampling.frequency, self.frequency, "frequency");
        from_file.set(
            &mut sampling.drain_interval_ms,
            self.drain_interval_ms,
            "drain_interval_ms",
        );
        for (target, value, id) in [
            (
                &mut sampling.counts_map_entries,
                self.counts_map_entries,
                "counts_map_entries",
            ),
            (
                &mut sampling.user_stack_map_entries,
                self.user_stack_map_entries,
                "user_stack_map_entries",
            ),
            (
                &mut sampling.kernel_stack_map_entries,
                self.kernel_stack_map_entries,
                "kernel_stack_map_entries",
            ),
            (
                &mut sampling.max_open_files,
                self.max_open_files,
                "max_open_files",
            ),
        ] {
            from_file.set(target, narrow(value), id);
        }
        from_file.set(
            &mut sampling.symbolizer_memory_mb,
            self.symbolizer_memory_mb,
            "symbolizer_memory_mb",
        );
        from_file.set(
            &mut sampling.symbolizer_deadline_ms,
            self.symbolizer_deadline_ms,
            "symbolizer_deadline_ms",
        );
        from_file.set(&mut sampling.unwind, self.unwind, "unwind");
        from_file.set(
            &mut sampling.unwind_table_memory_mb,
            self.unwind_table_memory_mb,
            "unwind_table_memory_mb",
        );
        from_file.set(
            &mut sampling.unwind_table_user_share_percent,
            self.unwind_table_user_share_percent,
            "unwind_table_user_share_percent",
        );
        from_file.set(&mut sampling.off_cpu, self.off_cpu, "off_cpu");
        from_file.set(
            &mut sampling.debug_file_lines,
            self.debug_file_lines,
            "debug_file_lines",
        );
        if let (Some(on), true) = (self.python_frames, from_file.allows("python_frames")) {
            sampling.no_python_frames = !on;
        }
        if let (Some(root), true) = (&self.proc_root, from_file.allows("proc_root")) {
            sampling.proc_root.clone_from(root);
        }
        from_file.set(
            &mut sampling.off_cpu_sample_every,
            self.off_cpu_sample_every,
            "off_cpu_sample_every",
        );
        from_file.set(
            &mut sampling.off_cpu_budget,
            self.off_cpu_budget,
            "off_cpu_budget",
        );
        from_file.set(
            &mut sampling.off_cpu_min_us,
            self.off_cpu_min_us,
            "off_cpu_min_us",
        );
        from_file.set(
            &mut sampling.alloc_sample_bytes,
            self.alloc_sample_bytes,
            "alloc_sample_bytes",
        );
        from_file.set(
            &mut sampling.alloc_max_processes,
            self.alloc_max_processes,
            "alloc_max_processes",
        );
        from_file.set(
            &mut sampling.alloc_budget_percent,
            self.alloc_budget_percent,
            "alloc_budget_percent",
        );
        if let (Some(comms), true) = (&self.alloc_trace_comms, from_file.allows("alloc_trace_comms")) {
            sampling.alloc_trace_comms.clone_from(comms);
        }
        if let (Some(units), true) = (&self.alloc_trace_units, from_file.allows("alloc_trace_units")) {
            sampling.alloc_trace_units.clone_from(units);
        }
        if let (Some(pids), true) = (&self.alloc_trace_pids, from_file.allows("alloc_trace_pids")) {
            sampling.alloc_trace_pids.clone_from(pids);
        }
    }

    fn apply_access(&self, args: &mut DaemonArgs, from_file: &FromFile) {
        from_file.set_path(
            &mut args.access_token_file,
            self.access_token_file.as_ref(),
            "access_token_file",
        );
        from_file.set(&mut args.insecure, self.insecure, "insecure");
        let tls = &mut args.tls;
        from_file.set_path(
            &mut tls.tls_cert_file,
            self.tls_cert_file.as_ref(),
            "tls_cert_file",
        );
        from_file.set_path(&mut tls.tls_key_file, self.tls_key_file.as_ref(), "tls_key_file");
        from_file.set_path(
            &mut tls.tls_client_ca_file,
            self.tls_client_ca_file.as_ref(),
            "tls_client_ca_file",
        );
        if let (Some(group), true) = (&self.access_group, from_file.allows("access_group")) {
            args.access_group.clone_from(group);
        }
    }

    fn apply_http(&self, args: &mut DaemonArgs, from_file: &FromFile) {
        let http = &mut args.http;
        from_file.set(
            &mut http.http_max_connections,
            self.http_max_connections,
            "http_max_connections",
        );
        from_file.set(
            &mut http.http_header_timeout_ms,
            self.http_header_timeout_ms,
            "http_header_timeout_ms",
        );
        from_file.set(
            &mut http.http_idle_timeout_seconds,
            self.http_idle_timeout_seconds,
            "http_idle_timeout_seconds",
        );
        from_file.set(
            &mut http.scrape_concurrency,
            self.scrape_concurrency,
            "scrape_concurrency",
        );
        from_file.set(&mut http.scrape_queue, self.scrape_queue, "scrape_queue");
        from_file.set(
            &mut http.scrape_memory_mb,
            self.scrape_memory_mb,
            "scrape_memory_mb",
        );
        from_file.set(&mut http.scrape_share_ms, self.scrape_share_ms, "scrape_share_ms");
    }
}
