//! Whether the kernel shows a user without CAP_SYSLOG the kernel's
//! addresses in /proc/kallsyms (`kallsyms_show_value`): only when
//! `kernel.kptr_restrict` is 0 and `kernel.perf_event_paranoid` is at most 1.
//! Read on each request, so changing either takes effect at once.

const KPTR_RESTRICT: &str = "/proc/sys/kernel/kptr_restrict";
const PERF_EVENT_PARANOID: &str = "/proc/sys/kernel/perf_event_paranoid";

/// True when an unprivileged user may read kernel addresses on this machine.
/// A sysctl that cannot be read counts as hiding them.
pub fn shown_to_users() -> bool {
    shown(sysctl(KPTR_RESTRICT), sysctl(PERF_EVENT_PARANOID))
}

fn shown(kptr_restrict: Option<i64>, perf_event_paranoid: Option<i64>) -> bool {
    kptr_restrict == Some(0) && perf_event_paranoid.is_some_and(|paranoid| paranoid <= 1)
}

fn sysctl(path: &str) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_shown_as_the_kernel_shows_them_in_kallsyms() {
        assert!(shown(Some(0), Some(1)));
        assert!(shown(Some(0), Some(-1)));
        assert!(shown(Some(0), Some(0)));
        assert!(
            !shown(Some(0), Some(2)),
            "Debian's and upstream's default paranoia"
        );
        assert!(!shown(Some(1), Some(-1)));
        assert!(!shown(Some(2), Some(-1)));
        assert!(!shown(None, Some(-1)));
        assert!(!shown(Some(0), None));
    }

    #[test]
    fn this_machines_sysctls_are_read() {
        assert!(sysctl(KPTR_RESTRICT).is_some() && sysctl(PERF_EVENT_PARANOID).is_some());
    }
}
