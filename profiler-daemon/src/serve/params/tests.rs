use super::*;

const LIMITS: Limits = Limits {
    pid_max: 4_194_304,
    max_seconds: 300,
};

fn pprof(query: &str) -> Result<ProfileParams, ParamError> {
    parse_pprof(Some(query), &LIMITS)
}

fn go(query: &str) -> Result<GoParams, ParamError> {
    parse_go_profile(Some(query), &LIMITS, ProfileType::Cpu)
}

fn message<T: fmt::Debug>(result: Result<T, ParamError>) -> String {
    result.expect_err("should be rejected").to_string()
}

#[test]
fn defaults_to_ten_seconds_of_the_whole_system() {
    for query in [None, Some("")] {
        let params = parse_pprof(query, &LIMITS).expect("accepted");
        assert_eq!(params.span, Span::Last(10));
        assert_eq!(params.filter, Filter::default());
        assert_eq!(
            params.profile_type,
            ProfileType::Cpu,
            "CPU unless type= says otherwise"
        );
    }
    let short = Limits {
        max_seconds: 4,
        ..LIMITS
    };
    assert_eq!(parse_pprof(None, &short).map(|p| p.span), Ok(Span::Last(4)));
}

#[test]
fn pids_repeat_and_split_on_commas_without_duplicates() {
    let params = pprof("pid=12,7&pid=12&seconds=60&tid=13&comm=busy&comm=other").expect("accepted");
    assert_eq!(params.span, Span::Last(60));
    assert_eq!(params.filter.pids, [12, 7]);
    assert_eq!(params.filter.tids, [13]);
    assert_eq!(params.filter.comms, ["busy", "other"]);
}

#[test]
fn values_are_percent_decoded() {
    let params = pprof("comm=kworker%2F0%3A1&pid=1%2C2").expect("accepted");
    assert_eq!(params.filter.comms, ["kworker/0:1"]);
    assert_eq!(params.filter.pids, [1, 2]);
    assert_eq!(pprof("comm=a+b").expect("accepted").filter.comms, ["a b"]);
}

#[test]
fn bad_pids_name_the_parameter_and_the_accepted_range() {
    for (query, value) in [
        ("pid=abc", "\"abc\""),
        ("pid=-1", "\"-1\""),
        ("pid=0", "\"0\""),
        ("pid=4194304", "\"4194304\""),
        ("pid=99999999999999999999999", "\"99999999999999999999999\""),
        ("pid=", "\"\""),
        ("pid=1,,2", "\"\""),
        ("pid=%2B5", "\"+5\""),
        ("pid=+5", "\" 5\""),
        ("pid=%205", "\" 5\""),
    ] {
        let text = message(pprof(query));
        assert_eq!(
            text,
            format!(
                "pid: {value} is not accepted; expected a process id from 1 to 4194303; repeat pid= or separate ids with commas"
            ),
            "{query}"
        );
    }
    assert!(pprof("pid=4194303").is_ok());
    assert!(
        message(pprof("tid=x"))
            .starts_with("tid: \"x\" is not accepted; expected a thread id from 1 to 4194303")
    );
}

#[test]
fn bad_seconds_name_the_parameter_and_the_retention() {
    for value in [
        "0",
        "-5",
        "abc",
        "1e9",
        "301",
        "1000000000",
        "",
        "5.0",
        "18446744073709551616",
    ] {
        assert_eq!(
            message(pprof(&format!("seconds={value}"))),
            format!("seconds: {value:?} is not accepted; expected an integer from 1 to 300 (the retention)"),
        );
    }
    assert_eq!(pprof("seconds=300").map(|p| p.span), Ok(Span::Last(300)));
    assert_eq!(
        message(pprof("seconds=5&seconds=6")),
        "seconds: given more than once; expected a single value"
    );
}

#[test]
fn bad_comms_are_rejected() {
    assert!(message(pprof("comm=")).starts_with("comm: \"\" is not accepted; expected a process name"));
    assert!(pprof(&format!("comm={}", "x".repeat(65))).is_err());
    assert!(pprof("comm=a%0Ab").is_err());
    assert!(pprof(&format!("comm={}", "x".repeat(64))).is_ok());
}

#[test]
fn unknown_parameters_are_rejected_on_pprof_and_ignored_by_go() {
    assert_eq!(
        message(pprof("pid=1&debug=1")),
        "unknown parameter \"debug\"; accepted: pid, tid, comm, unit, cgroup, container, seconds, start, end, type"
    );
    assert_eq!(go("debug=1&gc=1").map(|p| p.seconds), Ok(30));
}

#[test]
fn go_falls_back_to_thirty_seconds_like_net_http_pprof() {
    for value in ["", "0", "-5", "abc", "1e9", "5.5"] {
        assert_eq!(
            go(&format!("seconds={value}")).map(|p| p.seconds),
            Ok(30),
            "{value}"
        );
    }
    assert_eq!(go("").map(|p| p.seconds), Ok(30));
    assert_eq!(go("seconds=5&seconds=abc").map(|p| p.seconds), Ok(5));
    assert!(message(go("seconds=301")).starts_with("seconds: \"301\" is not accepted"));
    assert!(message(go("seconds=1000000000")).contains("1 to 300"));
    assert!(go("pid=abc").is_err());
    let short = Limits {
        max_seconds: 20,
        ..LIMITS
    };
    assert_eq!(
        parse_go_profile(None, &short, ProfileType::Cpu).map(|p| p.seconds),
        Ok(20)
    );
}

#[test]
fn long_query_strings_are_refused_before_parsing() {
    let query = format!("pid={}", "1,".repeat(5000));
    assert_eq!(
        message(pprof(&query)),
        format!(
            "query string too long: {} bytes; at most 4096 are accepted",
            query.len()
        )
    );
    assert!(matches!(go(&query), Err(ParamError::TooLong { .. })));
}

#[test]
fn quoted_values_stay_on_one_short_line() {
    let text = message(pprof(&format!("pid={}%0A", "9".repeat(100))));
    assert!(!text.contains('\n'));
    assert!(text.contains("...") && text.len() < 200, "{text}");
    // A multi-byte character straddling the cut does not panic.
    assert!(message(pprof(&format!("x{}=1", "é".repeat(40)))).contains("..."));
}

fn with_options(query: &str) -> Result<(ProfileParams, EndpointOptions), ParamError> {
    parse_with_options(Some(query), &LIMITS, &["format", "limit"])
}

#[test]
fn endpoint_options_are_returned_in_order_beside_the_filters() {
    let (params, options) = with_options("limit=5&pid=3&format=json").expect("accepted");
    assert_eq!(params.filter.pids, vec![3]);
    assert_eq!(params.span, Span::Last(window::DEFAULT_SECONDS));
    assert_eq!(
        options,
        vec![("limit", "5".to_owned()), ("format", "json".to_owned())]
    );
    assert_eq!(with_options("").map(|(_, options)| options), Ok(Vec::new()));
    // Values are decoded; the endpoint validates them.
    assert_eq!(
        with_options("format=%3Cb%3E").map(|(_, options)| options),
        Ok(vec![("format", "<b>".to_owned())])
    );
}

#[test]
fn endpoint_options_are_single_valued_and_listed_when_a_name_is_unknown() {
    assert_eq!(
        with_options("limit=5&limit=6")
            .map(|_| ())
            .expect_err("repeated")
            .to_string(),
        "limit: \"6\" is not accepted; expected a single value"
    );
    assert_eq!(
        with_options("icicle=true")
            .map(|_| ())
            .expect_err("unknown")
            .to_string(),
        "unknown parameter \"icicle\"; accepted: pid, tid, comm, unit, cgroup, container, seconds, start, end, type, format, limit"
    );
    // Another endpoint's options are not /pprof's.
    assert_eq!(
        message(pprof("format=json")),
        "unknown parameter \"format\"; accepted: pid, tid, comm, unit, cgroup, container, seconds, start, end, type"
    );
    // The common parameters keep their own rules.
    assert!(with_options("seconds=0&format=json").is_err());
}

#[test]
fn units_cgroups_and_containers() {
    let params = pprof("unit=a.service,b.service&unit=a.service&unit=user%401000.service%2Fx.service&cgroup=system.slice%2F&cgroup=%2Fa%2Cb&container=4f1e,ab").expect("accepted");
    assert_eq!(
        params.filter.units,
        ["a.service", "b.service", "user@1000.service/x.service"]
    );
    assert_eq!(params.filter.cgroups, ["/system.slice", "/a,b"]);
    assert_eq!(params.filter.containers, ["4f1e", "ab"]);
    assert!(params.filter.by_cgroup());
    assert!(!pprof("pid=1").expect("accepted").filter.by_cgroup());
    for (query, value) in [
        ("unit=nginx", "\"nginx\""),
        ("unit=", "\"\""),
        ("unit=a.service,,b.service", "\"\""),
        ("unit=a%20b.service", "\"a b.service\""),
        ("unit=foo%2Fbar.service", "\"foo/bar.service\""),
        (
            "unit=user%401000.service%2Fapp.slice",
            "\"user@1000.service/app.slice\"",
        ),
    ] {
        assert!(
            message(pprof(query)).starts_with(&format!(
                "unit: {value} is not accepted; expected a systemd unit name"
            )),
            "{query}: {}",
            message(pprof(query))
        );
    }
    for query in ["cgroup=%2Fa%2F..%2Fb", "cgroup=a%0Ab"] {
        assert!(message(pprof(query)).starts_with("cgroup: "), "{query}");
    }
    let long = format!("cgroup={}", "a".repeat(cgroup::MAX_PATH_BYTES + 1));
    assert!(message(pprof(&long)).starts_with("cgroup: "));
    for query in [
        "container=",
        "container=ABC",
        "container=xyz",
        &format!("container={}", "a".repeat(65)),
    ] {
        assert!(message(pprof(query)).starts_with("container: "), "{query}");
    }
    // Go's handler ignores unknown parameters but not bad filters.
    assert!(message(go("unit=nginx")).starts_with("unit: "));
}

#[test]
fn type_selects_the_profile_and_names_the_accepted_values() {
    for (value, expected) in [
        ("cpu", ProfileType::Cpu),
        ("offcpu", ProfileType::OffCpu),
        ("off-cpu", ProfileType::OffCpu),
        ("wall", ProfileType::Wall),
    ] {
        let params = pprof(&format!("type={value}&pid=3")).expect("accepted");
        assert_eq!(
            (params.profile_type, params.filter.pids),
            (expected, vec![3]),
            "{value}"
        );
    }
    for bad in ["", "CPU", "heap", "block", "wall%0A"] {
        assert_eq!(
            message(pprof(&format!("type={bad}"))),
            format!(
                "type: {:?} is not accepted; expected a profile type: cpu, offcpu, wall or alloc",
                bad.replace("%0A", "\n")
            ),
            "{bad}"
        );
    }
    assert_eq!(
        message(pprof("type=cpu&type=wall")),
        "type: \"wall\" is not accepted; expected a single value"
    );
    // Views take it like /pprof, beside their own options.
    let (params, options) = with_options("format=json&type=wall").expect("accepted");
    assert_eq!((params.profile_type, options.len()), (ProfileType::Wall, 1));
}

#[test]
fn go_paths_name_the_type_and_ignore_the_parameter() {
    let params =
        parse_go_profile(Some("type=cpu&seconds=5"), &LIMITS, ProfileType::OffCpu).expect("accepted");
    assert_eq!((params.profile_type, params.seconds), (ProfileType::OffCpu, 5));
    assert_eq!(go("type=nonsense").map(|p| p.profile_type), Ok(ProfileType::Cpu));
}
