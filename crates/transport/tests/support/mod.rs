//! A loopback HTTP/1.1 server inside the test process, scripted reply by reply.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What to answer one request with.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A complete response with a content-length.
    Full {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// A close-delimited body written chunk by chunk, flushing and pausing between chunks.
    Chunks {
        status: u16,
        headers: Vec<(String, String)>,
        chunks: Vec<Vec<u8>>,
        pause: Duration,
    },
    /// Read the request, then never answer.
    Hang,
}

impl Reply {
    pub fn json(status: u16, body: &str) -> Self {
        Reply::Full {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.as_bytes().to_vec(),
        }
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        match &mut self {
            Reply::Full { headers, .. } | Reply::Chunks { headers, .. } => {
                headers.push((name.into(), value.into()))
            }
            Reply::Hang => {}
        }
        self
    }

    /// An SSE body in one chunk.
    pub fn sse(body: &str) -> Self {
        Self::sse_chunks(vec![body.as_bytes().to_vec()], Duration::ZERO)
    }

    /// An SSE body delivered one byte per chunk.
    pub fn sse_bytewise(body: &str) -> Self {
        Self::sse_chunks(body.bytes().map(|b| vec![b]).collect(), Duration::ZERO)
    }

    pub fn sse_chunks(chunks: Vec<Vec<u8>>, pause: Duration) -> Self {
        Reply::Chunks {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks,
            pause,
        }
    }
}

pub struct Server {
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl Server {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

/// Serves `replies` in order, one per request; further requests get a 500.
pub async fn serve(replies: Vec<Reply>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(Mutex::new(Vec::new()));
    let replies = Arc::new(Mutex::new(std::collections::VecDeque::from(replies)));
    let recorded = Arc::clone(&requests);
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let (recorded, replies) = (Arc::clone(&recorded), Arc::clone(&replies));
            tokio::spawn(async move {
                let _ = handle(socket, recorded, replies).await;
            });
        }
    });
    Server { addr, requests }
}

async fn handle(
    mut socket: TcpStream,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    replies: Arc<Mutex<std::collections::VecDeque<Reply>>>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = socket.read(&mut tmp).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, path) = (
        first.next().unwrap_or_default().to_owned(),
        first.next().unwrap_or_default().to_owned(),
    );
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        })
        .collect();
    let mut body = buf[head_end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    if chunked {
        // Read to the terminating chunk, then decode.
        while !body.windows(5).any(|w| w == b"0\r\n\r\n") {
            let n = socket.read(&mut tmp).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&tmp[..n]);
        }
        body = dechunk(&body);
    } else {
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        while body.len() < len {
            let n = socket.read(&mut tmp).await?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&tmp[..n]);
        }
    }
    recorded.lock().unwrap().push(Recorded {
        method,
        path,
        headers,
        body,
        at: Instant::now(),
    });
    let reply = replies.lock().unwrap().pop_front().unwrap_or(Reply::json(
        500,
        r#"{"error":{"type":"api_error","message":"no reply scripted"}}"#,
    ));
    match reply {
        Reply::Full {
            status,
            headers,
            body,
        } => {
            let mut out = format!(
                "HTTP/1.1 {status} {}\r\ncontent-length: {}\r\nconnection: close\r\n",
                reason(status),
                body.len()
            );
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            socket.write_all(out.as_bytes()).await?;
            socket.write_all(&body).await?;
        }
        Reply::Chunks {
            status,
            headers,
            chunks,
            pause,
        } => {
            let mut out = format!(
                "HTTP/1.1 {status} {}\r\nconnection: close\r\n",
                reason(status)
            );
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            socket.write_all(out.as_bytes()).await?;
            socket.flush().await?;
            for c in chunks {
                socket.write_all(&c).await?;
                socket.flush().await?;
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
        }
        Reply::Hang => tokio::time::sleep(Duration::from_secs(30)).await,
    }
    socket.shutdown().await
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(i) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..i]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + size]);
        b = &b[i + 2 + size + 2..];
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        529 => "Overloaded",
        _ => "Status",
    }
}
