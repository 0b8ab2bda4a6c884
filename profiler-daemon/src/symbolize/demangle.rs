//! Symbol names as people read them: Rust (legacy and v0, hash dropped) and C++.

pub fn demangle(name: &str) -> String {
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        // `{:#}` leaves out the trailing hash (`::h0123456789abcdef`).
        return format!("{rust:#}");
    }
    if name.starts_with("_Z")
        && let Ok(symbol) = cpp_demangle::Symbol::new(name)
        && let Ok(demangled) = symbol.demangle(&cpp_demangle::DemangleOptions::default())
    {
        return demangled;
    }
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn rust_legacy_names_lose_their_hash() {
        assert_eq!(
            demangle("_ZN13rust_workload9burn_time17h0123456789abcdefE"),
            "rust_workload::burn_time"
        );
    }

    #[test]
    fn cpp_names_are_demangled() {
        assert_eq!(demangle("_ZN3foo3barEi"), "foo::bar(int)");
    }

    #[test]
    fn c_names_pass_through() {
        assert_eq!(demangle("hot_a"), "hot_a");
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
    }
}
