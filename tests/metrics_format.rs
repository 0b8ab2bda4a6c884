//! Issue 16: /metrics in the format the client accepts. Prometheus asks for
//! OpenMetrics first and gets it; everyone else (no Accept, `*/*`,
//! `text/plain`) gets the Prometheus text format 0.0.4, which
//! `promtool check metrics` reads and lints without a complaint.

use std::{
    collections::BTreeSet,
    io::{Read, Write},
    net::TcpStream,
    time::Duration,
};

use profilerd_tests::{daemon::Daemon, promtool, serial};

const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";
const OPEN_METRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// What a Prometheus server (2.x since 2.49) sends when it scrapes.
const PROMETHEUS_ACCEPT: &str =
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1";

struct Answer {
    status: u16,
    /// Names in lower case.
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map_or("", |(_, value)| value.as_str())
    }
}

/// GET /metrics over a raw HTTP/1.1 connection, so that no client library
/// adds an Accept header of its own; `accept` is sent if given.
fn get_metrics(daemon: &Daemon, accept: Option<&str>) -> Answer {
    let mut stream =
        TcpStream::connect(&daemon.addr).unwrap_or_else(|err| panic!("connecting to {}: {err}", daemon.addr));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    let accept = accept.map_or_else(String::new, |accept| format!("Accept: {accept}\r\n"));
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {}\r\n{accept}Connection: close\r\n\r\n",
        daemon.addr
    )
    .expect("sending the request");
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .expect("reading the answer to the end (Connection: close)");
    let raw = String::from_utf8(raw).expect("a UTF-8 answer");
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("an HTTP answer with a head and a body:\n{raw}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("a status line:\n{head}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let answer = Answer {
        status,
        headers,
        body: body.to_owned(),
    };
    // A String body has a length; a chunked one would need decoding here.
    assert_eq!(
        answer.header("content-length"),
        answer.body.len().to_string(),
        "/metrics is answered with a Content-Length matching its body:\n{head}"
    );
    answer
}

/// Name and labels of every sample, without values, timestamps or exemplars.
fn series(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .map(|line| {
            let end = line
                .rfind('}')
                .map_or_else(|| line.find(' ').unwrap_or(line.len()), |end| end + 1);
            line[..end].to_owned()
        })
        .collect()
}

#[test]
fn metrics_come_in_the_format_the_client_accepts() {
    let _serial = serial();
    let daemon = Daemon::start(&[]);
    // A 404 and a 400 too, so that the labelled request counter has several
    // series before the fetches below (which add none).
    assert_eq!(daemon.get("/debug/pprof/heap").status, 404, "heap is 404");
    assert_eq!(daemon.get("/pprof?seconds=x").status, 400, "a bad seconds is 400");
    assert_eq!(daemon.get("/metrics").status, 200, "/metrics answers");

    let plain = get_metrics(&daemon, None);
    assert_eq!(plain.status, 200, "/metrics without Accept: {}", plain.body);
    assert_eq!(
        plain.header("content-type"),
        TEXT_004,
        "without Accept, the text format 0.0.4"
    );
    assert!(
        plain.header("vary").eq_ignore_ascii_case("accept"),
        "Vary: Accept, got {:?}",
        plain.header("vary")
    );
    for openmetrics_only in ["# EOF", "# UNIT", "_created"] {
        assert!(
            !plain.body.contains(openmetrics_only),
            "the 0.0.4 text has no {openmetrics_only:?}:\n{}",
            plain.body
        );
    }
    assert!(
        plain.body.contains("# HELP profilerd_samples_total ")
            && plain.body.contains("# TYPE profilerd_samples_total counter\n")
            && plain
                .body
                .contains("# TYPE profilerd_http_requests_total counter\n"),
        "a counter's HELP and TYPE name its _total samples in 0.0.4:\n{}",
        plain.body
    );
    match promtool::check_metrics(&plain.body) {
        Ok(said) => assert!(
            said.trim().is_empty(),
            "promtool check metrics passes with nothing to say, said:\n{said}"
        ),
        Err(failure) => panic!(
            "promtool check metrics must pass on the 0.0.4 text: {failure}\nthe text:\n{}",
            plain.body
        ),
    }

    for accept in [
        "*/*",
        "text/plain",
        "text/plain;version=0.0.4;q=1",
        "application/openmetrics-text;q=0,*/*",
    ] {
        let answer = get_metrics(&daemon, Some(accept));
        assert_eq!(
            (answer.status, answer.header("content-type")),
            (200, TEXT_004),
            "Accept: {accept} gets the text format 0.0.4"
        );
    }

    let open_metrics = get_metrics(&daemon, Some(PROMETHEUS_ACCEPT));
    assert_eq!(
        (open_metrics.status, open_metrics.header("content-type")),
        (200, OPEN_METRICS),
        "Prometheus's Accept ({PROMETHEUS_ACCEPT}) prefers OpenMetrics and gets it: {}",
        open_metrics.body
    );
    assert!(
        open_metrics.header("vary").eq_ignore_ascii_case("accept"),
        "Vary: Accept on OpenMetrics too, got {:?}",
        open_metrics.header("vary")
    );
    assert!(
        open_metrics.body.ends_with("\n# EOF\n"),
        "OpenMetrics ends in # EOF:\n{}",
        open_metrics.body
    );
    assert!(
        open_metrics.body.contains("# TYPE profilerd_samples counter\n"),
        "OpenMetrics names the counter family without _total:\n{}",
        open_metrics.body
    );
    // promtool reads 0.0.4 only: what OpenMetrics clients got before is what
    // it refused, which is what the conversion is for.
    assert!(
        promtool::check_metrics(&open_metrics.body).is_err(),
        "promtool check metrics fails on OpenMetrics (else this test could not tell the formats apart)"
    );
    assert_eq!(
        series(&plain.body),
        series(&open_metrics.body),
        "the same series in both formats"
    );
}
