//! Byte-level HTTP/1.1 on both sides of the proxy, for tests about exactly what crosses it.
//!
//! [`raw_upstream`]: an upstream that records every byte it receives, on every connection,
//! and answers each request with a canned response (a 200 by default; any bytes, such as a
//! 101, with [`RawUpstream::answering`]). It reads a request to its end (Content-Length or
//! chunked, trailers included) before answering, and keeps the connection for the next one;
//! after a 101 it only records.
//!
//! [`raw_exchange`]: sends bytes as they are (a request no client library would write) on a new
//! connection and reads one response head and its Content-Length body.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The canned answer unless told otherwise.
pub const RAW_OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

#[derive(Clone)]
pub struct RawUpstream {
    pub addr: SocketAddr,
    /// What each connection received, in the order they were accepted.
    connections: Arc<Mutex<Vec<Received>>>,
}

/// The bytes one connection received so far.
type Received = Arc<Mutex<Vec<u8>>>;

/// An upstream answering every request with [`RAW_OK`].
pub async fn raw_upstream() -> RawUpstream {
    RawUpstream::answering(RAW_OK).await
}

impl RawUpstream {
    /// An upstream answering every request with `response`, written as it is.
    pub async fn answering(response: &'static [u8]) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = RawUpstream {
            addr: listener.local_addr().unwrap(),
            connections: Arc::default(),
        };
        let connections = upstream.connections.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let received = Arc::new(Mutex::new(Vec::new()));
                connections.lock().unwrap().push(received.clone());
                tokio::spawn(serve(stream, received, response));
            }
        });
        upstream
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every byte received so far, connection after connection.
    pub fn received(&self) -> Vec<u8> {
        let connections = self.connections.lock().unwrap();
        connections
            .iter()
            .flat_map(|c| c.lock().unwrap().clone())
            .collect()
    }

    /// [`Self::received`] as text (bytes that are not UTF-8 replaced).
    pub fn received_text(&self) -> String {
        String::from_utf8_lossy(&self.received()).into_owned()
    }

    /// The request heads received so far, each as its lines (request line first).
    pub fn heads(&self) -> Vec<Vec<String>> {
        self.received_text()
            .split("\r\n\r\n")
            .filter(|block| {
                block
                    .lines()
                    .next()
                    .is_some_and(|line| line.ends_with(" HTTP/1.1"))
            })
            .map(|block| block.lines().map(str::to_owned).collect())
            .collect()
    }

    /// The request lines received so far (`GET /x HTTP/1.1`).
    pub fn request_lines(&self) -> Vec<String> {
        self.heads().into_iter().map(|h| h[0].clone()).collect()
    }

    /// How many connections were accepted.
    pub fn connection_count(&self) -> usize {
        self.connections.lock().unwrap().len()
    }
}

async fn serve(mut stream: TcpStream, received: Received, response: &'static [u8]) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let switched = response.starts_with(b"HTTP/1.1 101");
    loop {
        let end = loop {
            if let Some(end) = request_end(&buf) {
                break end;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    received.lock().unwrap().extend_from_slice(&chunk[..n]);
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        };
        let head_request = buf.starts_with(b"HEAD ");
        buf.drain(..end);
        // A response to HEAD is its head alone.
        let answer = match find(response, b"\r\n\r\n") {
            Some(head_end) if head_request => &response[..head_end + 4],
            _ => response,
        };
        if stream.write_all(answer).await.is_err() {
            return;
        }
        if switched {
            // A tunnel now: record what comes, answer nothing.
            loop {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => received.lock().unwrap().extend_from_slice(&chunk[..n]),
                }
            }
        }
    }
}

/// Where the first whole request in `buf` ends, if it is whole.
fn request_end(buf: &[u8]) -> Option<usize> {
    let head_end = find(buf, b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.trim() == name)
            .map(|(_, v)| v.trim().to_owned())
    };
    if header("transfer-encoding").is_some_and(|te| te.ends_with("chunked")) {
        // Chunks, then a zero chunk, trailers and an empty line.
        let mut at = head_end;
        loop {
            let line_end = at + find(&buf[at..], b"\r\n")?;
            let size_text = String::from_utf8_lossy(&buf[at..line_end]);
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            at = line_end + 2;
            if size == 0 {
                // Trailer lines, if any, then an empty line.
                let rest = &buf[at..];
                let trailers_end = if rest.starts_with(b"\r\n") {
                    2
                } else {
                    find(rest, b"\r\n\r\n")? + 4
                };
                return Some(at + trailers_end);
            }
            at += size + 2;
            if at > buf.len() {
                return None;
            }
        }
    }
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (buf.len() >= head_end + length).then_some(head_end + length)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A response as [`raw_exchange`] read it.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header lines as sent, names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends `request` as it is to `addr` on a new connection and reads one response: its head,
/// then a Content-Length body (none for a 1xx, to HEAD or without Content-Length). Panics when no
/// response head arrives within 10 s.
pub async fn raw_exchange(addr: SocketAddr, request: &[u8]) -> RawResponse {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let read = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        let head_end = loop {
            if let Some(end) = find(&buf, b"\r\n\r\n") {
                break end + 4;
            }
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "the connection closed with no response head; got {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {head:?}"));
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let length = if status < 200 || request.starts_with(b"HEAD ") {
            0
        } else {
            length
        };
        while buf.len() < head_end + length {
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the connection closed inside the body");
            buf.extend_from_slice(&chunk[..n]);
        }
        RawResponse {
            status,
            headers,
            body: buf[head_end..head_end + length].to_vec(),
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("no response within 10 s")
}
