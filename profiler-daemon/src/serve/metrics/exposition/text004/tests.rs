use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram, info::Info},
    registry::{Registry, Unit},
};

use super::*;

fn converted(open_metrics: &str) -> String {
    to_text_004(open_metrics).unwrap_or_else(|err| panic!("converting must succeed: {err}\n{open_metrics}"))
}

/// What prometheus-client encodes for the kinds of metric profilerd has (a
/// labelled counter family, as the HTTP requests are, plain and float
/// counters, gauges, a unit), and for an info and a histogram.
#[test]
fn prometheus_client_output_becomes_valid_text_004() {
    let mut registry = Registry::with_prefix("profilerd");
    let requests = Family::<Vec<(&str, &str)>, Counter>::default();
    requests
        .get_or_create(&vec![("endpoint", "/metrics"), ("status", "200")])
        .inc_by(3);
    requests
        .get_or_create(&vec![("endpoint", "/pprof"), ("status", "400")])
        .inc();
    registry.register(
        "http_requests",
        "HTTP requests served, by endpoint and status",
        requests,
    );
    let seconds = Counter::<f64>::default();
    seconds.inc_by(1.5);
    registry.register_with_unit("drain", "Time spent draining", Unit::Seconds, seconds);
    let open: Gauge = Gauge::default();
    open.set(-1);
    registry.register("http_connections", "HTTP connections open", open);
    registry.register("build", "Build facts", Info::new(vec![("version", "0.1.0")]));
    let latency = Histogram::new([0.5, 1.0]);
    latency.observe(0.7);
    registry.register("latency_seconds", "Latency", latency);
    let mut open_metrics = String::new();
    encode(&mut open_metrics, &registry).expect("encoding into a String");

    let expected = "\
# HELP profilerd_http_requests_total HTTP requests served, by endpoint and status.
# TYPE profilerd_http_requests_total counter
profilerd_http_requests_total{endpoint=\"/metrics\",status=\"200\"} 3
profilerd_http_requests_total{endpoint=\"/pprof\",status=\"400\"} 1
# HELP profilerd_drain_seconds_total Time spent draining.
# TYPE profilerd_drain_seconds_total counter
profilerd_drain_seconds_total 1.5
# HELP profilerd_http_connections HTTP connections open.
# TYPE profilerd_http_connections gauge
profilerd_http_connections -1
# HELP profilerd_build_info Build facts.
# TYPE profilerd_build_info gauge
profilerd_build_info{version=\"0.1.0\"} 1
# HELP profilerd_latency_seconds Latency.
# TYPE profilerd_latency_seconds histogram
profilerd_latency_seconds_sum 0.7
profilerd_latency_seconds_count 1
profilerd_latency_seconds_bucket{le=\"0.5\"} 0
profilerd_latency_seconds_bucket{le=\"1.0\"} 1
profilerd_latency_seconds_bucket{le=\"+Inf\"} 1
";
    // Sorted, as the families of a registry come in no fixed order, nor
    // do the label sets of a family (a hash map).
    let sorted = |text: &str| {
        let mut families: Vec<String> = text
            .split("# HELP ")
            .filter(|family| !family.is_empty())
            .map(|family| {
                let mut lines: Vec<&str> = family.lines().collect();
                lines.sort_unstable();
                lines.join("\n")
            })
            .collect();
        families.sort();
        families
    };
    let text = converted(&open_metrics);
    assert_eq!(
        sorted(&text),
        sorted(expected),
        "0.0.4 of:\n{open_metrics}\nwas:\n{text}"
    );
    assert!(
        open_metrics.contains("# UNIT profilerd_drain_seconds seconds"),
        "the input has a # UNIT line to drop:\n{open_metrics}"
    );
}

#[test]
fn empty_families_keep_their_metadata() {
    // A labelled family before its first sample (the HTTP requests at the
    // first scrape).
    let text = converted("# HELP a_requests Requests.\n# TYPE a_requests counter\n# EOF\n");
    assert_eq!(
        text, "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\n",
        "an empty counter family"
    );
}

#[test]
fn types_0_0_4_lacks_are_mapped_keeping_sample_names() {
    let open_metrics = "\
# HELP door State of the door.
# TYPE door stateset
door{door=\"open\"} 1
door{door=\"closed\"} 0
# TYPE mystery unknown
mystery 7
orphan{a=\"b\"} 2
# HELP queue Queue lengths.
# TYPE queue gaugehistogram
queue_bucket{le=\"1.0\"} 2
queue_bucket{le=\"+Inf\"} 3
queue_gcount 3
queue_gsum 4.5
# HELP rpc RPC durations.
# TYPE rpc summary
# UNIT rpc seconds
rpc{quantile=\"0.5\"} 0.1
rpc_sum 2.0
rpc_count 9
rpc_created 1700000000.5
# EOF
";
    let expected = "\
# HELP door State of the door.
# TYPE door gauge
door{door=\"open\"} 1
door{door=\"closed\"} 0
# TYPE mystery untyped
mystery 7
# TYPE orphan untyped
orphan{a=\"b\"} 2
# HELP queue_bucket Queue lengths.
# TYPE queue_bucket gauge
queue_bucket{le=\"1.0\"} 2
queue_bucket{le=\"+Inf\"} 3
# HELP queue_gsum Queue lengths.
# TYPE queue_gsum gauge
queue_gsum 4.5
# HELP queue_gcount Queue lengths.
# TYPE queue_gcount gauge
queue_gcount 3
# HELP rpc RPC durations.
# TYPE rpc summary
rpc{quantile=\"0.5\"} 0.1
rpc_sum 2.0
rpc_count 9
";
    assert_eq!(converted(open_metrics), expected, "mapped types");
}

#[test]
fn exemplars_created_samples_and_timestamps() {
    let open_metrics = "\
# HELP jobs Jobs done.
# TYPE jobs counter
jobs_total{queue=\"a # b\",path=\"x}\\\"y\"} 4 1700000000.25 # {trace_id=\"42\"} 1.0 1700000000.0
jobs_created{queue=\"a # b\"} 1699999999.0
jobs_total{queue=\"c\"} +Inf # {trace_id=\"43\"} 1
# HELP jobs_created_at A gauge whose name ends like a created sample.
# TYPE jobs_created_at gauge
jobs_created_at 1
# EOF
";
    let expected = "\
# HELP jobs_total Jobs done.
# TYPE jobs_total counter
jobs_total{queue=\"a # b\",path=\"x}\\\"y\"} 4 1700000000250
jobs_total{queue=\"c\"} +Inf
# HELP jobs_created_at A gauge whose name ends like a created sample.
# TYPE jobs_created_at gauge
jobs_created_at 1
";
    assert_eq!(
        converted(open_metrics),
        expected,
        "exemplars and _created dropped, ms timestamps"
    );
}

#[test]
fn help_is_escaped_for_0_0_4() {
    let open_metrics = "\
# HELP a Quote \\\" backslash \\\\ newline \\n raw C:\\dir \"plain\".
# TYPE a gauge
a 1
# EOF
";
    // In 0.0.4 `\"` is an error and `"` needs no escape; `\\` and `\n` stay.
    let expected = "\
# HELP a Quote \" backslash \\\\ newline \\n raw C:\\\\dir \"plain\".
# TYPE a gauge
a 1
";
    assert_eq!(converted(open_metrics), expected, "HELP escapes");
}

#[test]
fn what_is_not_openmetrics_is_refused() {
    let cases = [
        ("# TYPE a gauge\na 1\n", "no # EOF"),
        ("# TYPE a gauge\na 1\n# EOF\nb 2\n", "text after # EOF"),
        ("# TYPE a gauge\n# TYPE a counter\n# EOF\n", "repeated or late"),
        ("# TYPE a gauge\na 1\n# TYPE a gauge\n# EOF\n", "repeated or late"),
        (
            "# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\n# TYPE a gauge\n# EOF\n",
            "seen twice",
        ),
        ("# TYPE a widget\n# EOF\n", "unknown type"),
        ("# FOO a b\n# EOF\n", "unknown comment"),
        ("# TYPE 1a gauge\n# EOF\n", "not a metric name"),
        ("a{b=\"c} 1\n# EOF\n", "unterminated label set"),
        ("a one\n# EOF\n", "not a number"),
        ("a 1 soon\n# EOF\n", "timestamp"),
        ("a\n# EOF\n", "without a value"),
        ("\n# EOF\n", "without a value"),
    ];
    for (text, expected) in cases {
        let err = to_text_004(text).expect_err(&format!("{text:?} must be refused"));
        assert!(
            err.reason.contains(expected),
            "{text:?}: expected an error about {expected:?}, got {err}"
        );
    }
}
