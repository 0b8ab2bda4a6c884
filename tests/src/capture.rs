//! A minimal HTTP/1.1 server on a loopback port that hands each request to
//! the test and answers what the test chooses: the stand-in for a push
//! backend whose answers (accept, fail, refuse) the test decides one by one.
//!
//! Only what a push client sends is understood: a request line, headers,
//! and a `Content-Length` body. Anything else (a chunked body, a malformed
//! line) is handed to the test as an error, so that it fails saying what
//! came.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    time::{Duration, Instant},
};

/// The largest body read: far above any push (Pyroscope's default burst
/// limit is 2 MiB per profile).
const MAX_BODY: usize = 64 << 20;

/// How long a connection waits for the test's answer before it gives up.
const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// One request as it came.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub version: String,
    /// Names lowercased, in the order sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When its last byte came.
    pub received: Instant,
}

impl Request {
    /// The values of every header named `name` (case-insensitive).
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
            .collect()
    }

    /// The one value of header `name`, if it came once; panics if it came
    /// more than once.
    pub fn header(&self, name: &str) -> Option<&str> {
        let values = self.header_values(name);
        assert!(
            values.len() <= 1,
            "expected header {name} at most once, got {values:?} in {:?}",
            self.headers
        );
        values.first().copied()
    }
}

/// What the server answers one request with.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

/// A request waiting for the test's answer.
pub struct Exchange {
    pub request: Request,
    answer: mpsc::Sender<Reply>,
}

impl Exchange {
    pub fn reply(self, reply: Reply) {
        // The connection may be gone (the client timed out): the next
        // request says so.
        let _ = self.answer.send(reply);
    }
}

/// The server. Its listening thread lives as long as the test process;
/// each connection's thread ends once the server is dropped (nothing takes
/// its requests) or its client closes.
pub struct CaptureServer {
    pub port: u16,
    requests: mpsc::Receiver<Result<Exchange, String>>,
}

impl CaptureServer {
    pub fn start() -> Self {
        let listener =
            TcpListener::bind("127.0.0.1:0").expect("binding a loopback port for the capture server");
        let port = listener
            .local_addr()
            .expect("the capture server's address")
            .port();
        let (tx, requests) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let tx = tx.clone();
                std::thread::spawn(move || serve(stream, &tx));
            }
        });
        Self { port, requests }
    }

    /// The next request, waiting up to `timeout` for it.
    pub fn next(&self, timeout: Duration) -> Exchange {
        match self.requests.recv_timeout(timeout) {
            Ok(Ok(exchange)) => exchange,
            Ok(Err(error)) => panic!("expected a well-formed HTTP/1.1 request, got: {error}"),
            Err(_) => panic!(
                "expected a request on 127.0.0.1:{} within {timeout:?}, none came",
                self.port
            ),
        }
    }
}

/// Serves the requests of one connection, each answered by the test.
fn serve(stream: TcpStream, requests: &mpsc::Sender<Result<Exchange, String>>) {
    let _ = stream.set_read_timeout(Some(ANSWER_WAIT));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let request = match read_request(&mut reader) {
            Ok(Some(request)) => request,
            // The client closed the connection between requests.
            Ok(None) => return,
            Err(error) => {
                let _ = requests.send(Err(error));
                return;
            }
        };
        let (answer, reply) = mpsc::channel();
        if requests.send(Ok(Exchange { request, answer })).is_err() {
            return;
        }
        let Ok(reply) = reply.recv_timeout(ANSWER_WAIT) else {
            return;
        };
        if write_reply(&mut writer, &reply).is_err() {
            return;
        }
    }
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Result<Option<Request>, String> {
    let mut line = String::new();
    let read = reader
        .read_line(&mut line)
        .map_err(|err| format!("reading the request line: {err}"))?;
    if read == 0 {
        return Ok(None);
    }
    let request_line = line.trim_end_matches(['\r', '\n']).to_owned();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("a request line of three parts, got {request_line:?}"));
    };
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader
            .read_line(&mut line)
            .map_err(|err| format!("reading the headers of {request_line:?}: {err}"))?;
        if !line.ends_with("\r\n") {
            return Err(format!("a header line ending in CRLF, got {line:?}"));
        }
        let header = line.trim_end_matches(['\r', '\n']);
        if header.is_empty() {
            break;
        }
        let (name, value) = header
            .split_once(':')
            .ok_or_else(|| format!("a header `name: value`, got {header:?}"))?;
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    if let Some(encoding) = find("transfer-encoding") {
        return Err(format!(
            "a Content-Length body, got Transfer-Encoding: {encoding}"
        ));
    }
    let length: usize = match find("content-length") {
        Some(length) => length
            .parse()
            .map_err(|_| format!("a numeric Content-Length, got {length:?}"))?,
        None => 0,
    };
    if length > MAX_BODY {
        return Err(format!(
            "a body of at most {MAX_BODY} bytes, got Content-Length {length}"
        ));
    }
    let mut body = vec![0; length];
    reader
        .read_exact(&mut body)
        .map_err(|err| format!("reading the {length}-byte body of {request_line:?}: {err}"))?;
    Ok(Some(Request {
        method: method.to_owned(),
        path: path.to_owned(),
        version: version.to_owned(),
        headers,
        body,
        received: Instant::now(),
    }))
}

fn write_reply(writer: &mut TcpStream, reply: &Reply) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\r\n",
        reply.status,
        reason(reply.status),
        reply.content_type,
        reply.body.len()
    );
    writer.write_all(head.as_bytes())?;
    writer.write_all(&reply.body)?;
    writer.flush()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}
