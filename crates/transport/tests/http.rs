//! The HTTP backends against a loopback server in the test process: success, every error
//! kind, retries with `retry-after`, truncated and byte-by-byte streams, timeouts.
#![cfg(feature = "http")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use forkhive_core::Usage;
use forkhive_transport::conformance::{check_error, check_round_trip, sample_request};
use forkhive_transport::http::{HttpBackend, HttpConfig, RetryPolicy};
use forkhive_transport::{
    AnthropicCodec, Backend, BackendExt, Codec, Error, ModelStop, OpenAiCodec,
};
use support::{Reply, serve};

const ANTHROPIC_OK: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hello!"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":3,"cache_creation_input_tokens":0,"cache_read_input_tokens":2048}}"#;

fn anthropic_sse() -> String {
    let events = [
        (
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":12,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":2048}}}"#,
        ),
        ("ping", r#"{"type":"ping"}"#),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"lo!"}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":3}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ];
    events
        .iter()
        .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
        .collect()
}

const OPENAI_OK: &str = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":2060,"completion_tokens":3,"total_tokens":2063,"prompt_tokens_details":{"cached_tokens":2048}}}"#;

fn openai_sse() -> String {
    [
        r#"{"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null},"finish_reason":null}]}"#,
        r#"{"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
        r#"{"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"lo!"},"finish_reason":null}]}"#,
        r#"{"id":"c1","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        r#"{"id":"c1","model":"m","choices":[],"usage":{"prompt_tokens":2060,"completion_tokens":3,"total_tokens":2063,"prompt_tokens_details":{"cached_tokens":2048}}}"#,
        "[DONE]",
    ]
    .iter()
    .map(|d| format!("data: {d}\n\n"))
    .collect()
}

fn fast_retries(max_retries: u32) -> RetryPolicy {
    RetryPolicy {
        max_retries,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        ..RetryPolicy::default()
    }
}

fn anthropic(url: &str, retries: u32) -> HttpBackend {
    HttpBackend::anthropic(
        HttpConfig::new(url)
            .with_api_key("sk-ant-test")
            .with_header("x-trace", "t1")
            .with_retry(fast_retries(retries)),
    )
    .unwrap()
}

fn openai(url: &str, retries: u32) -> HttpBackend {
    HttpBackend::openai(
        HttpConfig::new(format!("{url}/v1"))
            .with_api_key("sk-oa-test")
            .with_retry(fast_retries(retries)),
    )
    .unwrap()
}

#[tokio::test]
async fn anthropic_sends_the_codec_bytes_with_its_headers() {
    let server = serve(vec![Reply::json(200, ANTHROPIC_OK)]).await;
    let backend = anthropic(&server.url(), 0);
    let request = sample_request();
    let r = backend.send(&request).await.unwrap();
    assert_eq!(r.message.text(), "Hello!");
    assert_eq!(r.stop_reason, Some(ModelStop::EndTurn));
    assert_eq!(
        r.usage,
        Usage {
            input_tokens: 12,
            output_tokens: 3,
            cache_read_tokens: 2048,
            ..Usage::default()
        }
    );
    let seen = &server.requests()[0];
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("POST", "/v1/messages")
    );
    assert_eq!(seen.header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(seen.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(seen.header("x-trace"), Some("t1"));
    assert_eq!(seen.header("authorization"), None);
    let expected = AnthropicCodec::default().encode(&request, false).to_bytes();
    assert_eq!(
        seen.header("content-length"),
        Some(expected.len().to_string().as_str())
    );
    assert_eq!(seen.body, expected.to_vec());
}

#[tokio::test]
async fn openai_sends_the_codec_bytes_with_a_bearer_key() {
    let server = serve(vec![Reply::json(200, OPENAI_OK)]).await;
    let backend = openai(&server.url(), 0);
    let request = sample_request();
    let r = backend.send(&request).await.unwrap();
    assert_eq!(
        r.usage,
        Usage {
            input_tokens: 12,
            output_tokens: 3,
            cache_read_tokens: 2048,
            ..Usage::default()
        }
    );
    let seen = &server.requests()[0];
    assert_eq!(seen.path, "/v1/chat/completions");
    assert_eq!(seen.header("authorization"), Some("Bearer sk-oa-test"));
    assert_eq!(
        seen.body,
        OpenAiCodec::default()
            .encode(&request, false)
            .to_bytes()
            .to_vec()
    );
}

#[tokio::test]
async fn both_backends_pass_the_conformance_suite() {
    let server = serve(vec![
        Reply::json(200, ANTHROPIC_OK),
        Reply::sse(&anthropic_sse()),
    ])
    .await;
    check_round_trip(&anthropic(&server.url(), 0), &sample_request())
        .await
        .unwrap();
    let server = serve(vec![Reply::json(200, OPENAI_OK), Reply::sse(&openai_sse())]).await;
    check_round_trip(&openai(&server.url(), 0), &sample_request())
        .await
        .unwrap();

    let bad = r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: must be positive"}}"#;
    let server = serve(vec![Reply::json(400, bad), Reply::json(400, bad)]).await;
    let err = check_error(&anthropic(&server.url(), 3), &sample_request(), |e| {
        matches!(e, Error::InvalidRequest { status: 400, .. })
    })
    .await
    .unwrap();
    assert_eq!(
        err.to_string(),
        "invalid request (HTTP 400): max_tokens: must be positive"
    );
    assert_eq!(server.requests().len(), 2, "a 400 is not retried");
}

#[tokio::test]
async fn streams_survive_one_byte_per_chunk() {
    let server = serve(vec![Reply::sse_bytewise(&anthropic_sse())]).await;
    let r = anthropic(&server.url(), 0)
        .stream_to_response(&sample_request())
        .await
        .unwrap();
    assert_eq!(r.message.text(), "Hello!");
    assert_eq!(r.usage.cache_read_tokens, 2048);
    let seen = &server.requests()[0];
    assert!(String::from_utf8_lossy(&seen.body).ends_with(r#","stream":true}"#));

    let server = serve(vec![Reply::sse_bytewise(&openai_sse())]).await;
    let r = openai(&server.url(), 0)
        .stream_to_response(&sample_request())
        .await
        .unwrap();
    assert_eq!(r.message.text(), "Hello!");
    assert_eq!(r.usage.cache_read_tokens, 2048);
}

#[tokio::test]
async fn a_stream_cut_mid_event_is_a_truncation_error() {
    let sse = anthropic_sse();
    let cut = sse.find("event: content_block_delta").unwrap() + 30;
    let server = serve(vec![Reply::sse(&sse[..cut])]).await;
    let err = anthropic(&server.url(), 3)
        .stream_to_response(&sample_request())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "stream truncated after 3 events: the connection closed in the middle of an event"
    );
    assert!(!err.is_retryable());
    assert_eq!(server.requests().len(), 1);

    // Cut cleanly between events, before message_stop.
    let cut = sse.find("event: message_stop").unwrap();
    let server = serve(vec![Reply::sse(&sse[..cut])]).await;
    let err = anthropic(&server.url(), 0)
        .stream_to_response(&sample_request())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "stream truncated after 7 events: the connection closed before the end-of-stream event"
    );

    // OpenAI without its [DONE].
    let sse = openai_sse();
    let server = serve(vec![Reply::sse(&sse[..sse.find("data: [DONE]").unwrap()])]).await;
    let err = openai(&server.url(), 0)
        .stream_to_response(&sample_request())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::TruncatedStream { .. }), "{err}");
}

/// A server that answers a streamed request whole (it ignores `"stream": true`) is named for
/// what it did, once, not taken for a connection cut before its first event and retried.
#[tokio::test]
async fn a_whole_answer_to_a_streamed_request_says_so() {
    let server = serve(vec![Reply::json(200, ANTHROPIC_OK)]).await;
    let err = anthropic(&server.url(), 3)
        .stream_to_response(&sample_request())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Decode {
                what: "streamed response",
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("answered HTTP 200 with content-type `application/json`, not an event stream (`text/event-stream`): does it stream? It began: \"{\\\"id\\\":\\\"msg_1\\\""),
        "{text}"
    );
    assert!(!err.is_retryable());
    assert_eq!(server.requests().len(), 1);

    // A mislabelled body that goes on and on (512 bytes every 200 ms, 20 s in all) is not
    // read whole to quote it: the error comes after its first kilobyte.
    let server = serve(vec![Reply::Chunks {
        status: 200,
        headers: vec![("content-type".into(), "application/x-ndjson".into())],
        chunks: vec![vec![b'x'; 512]; 100],
        pause: Duration::from_millis(200),
    }])
    .await;
    let started = Instant::now();
    let err = anthropic(&server.url(), 0)
        .stream_to_response(&sample_request())
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.to_string()
            .contains("content-type `application/x-ndjson`, not an event stream"),
        "{err}"
    );
    assert!(
        err.to_string()
            .ends_with(&format!("It began: \"{}\"", "x".repeat(200))),
        "{err}"
    );
}

#[tokio::test]
async fn each_error_status_maps_to_its_kind() {
    let body = |t: &str, m: &str| {
        format!(r#"{{"type":"error","error":{{"type":"{t}","message":"{m}"}}}}"#)
    };
    let cases: Vec<(u16, String, &str)> = vec![
        (
            400,
            body("invalid_request_error", "messages: field required"),
            "invalid request (HTTP 400): messages: field required",
        ),
        (
            401,
            body("authentication_error", "invalid x-api-key"),
            "authentication failed (HTTP 401): invalid x-api-key",
        ),
        (
            403,
            body("permission_error", "no access"),
            "authentication failed (HTTP 403): no access",
        ),
        (
            404,
            body("not_found_error", "model: nope"),
            "invalid request (HTTP 404): model: nope",
        ),
        (
            429,
            body("rate_limit_error", "slow down"),
            "rate limited (HTTP 429): slow down",
        ),
        (
            500,
            body("api_error", "boom"),
            "provider unavailable (HTTP 500): boom",
        ),
        (
            529,
            body("overloaded_error", "Overloaded"),
            "provider overloaded: Overloaded",
        ),
        (
            503,
            "<html>upstream down</html>".to_owned(),
            "provider unavailable (HTTP 503): <html>upstream down</html>",
        ),
    ];
    for (status, b, text) in cases {
        let server = serve(vec![Reply::json(status, &b)]).await;
        let err = anthropic(&server.url(), 0)
            .send(&sample_request())
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), text, "status {status}");
        assert!(!err.to_string().contains("sk-ant-test"));
    }
    // OpenAI's error shape.
    let server = serve(vec![Reply::json(
        400,
        r#"{"error":{"message":"bad model","type":"invalid_request_error","code":null}}"#,
    )])
    .await;
    let err = openai(&server.url(), 0)
        .send(&sample_request())
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "invalid request (HTTP 400): bad model");
}

#[tokio::test]
async fn a_429_waits_for_retry_after_then_succeeds() {
    let limited = r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
    let server = serve(vec![
        Reply::json(429, limited).with_header("retry-after", "1"),
        Reply::json(200, ANTHROPIC_OK),
    ])
    .await;
    let r = anthropic(&server.url(), 2)
        .send(&sample_request())
        .await
        .unwrap();
    assert_eq!(r.message.text(), "Hello!");
    let seen = server.requests();
    assert_eq!(seen.len(), 2);
    let waited = seen[1].at - seen[0].at;
    assert!(
        waited >= Duration::from_millis(950),
        "retry-after: 1 was not honoured: {waited:?}"
    );
    assert_eq!(seen[0].body, seen[1].body, "the same bytes are sent again");

    let server = serve(vec![
        Reply::json(429, limited).with_header("retry-after-ms", "120"),
        Reply::sse(&anthropic_sse()),
    ])
    .await;
    let r = anthropic(&server.url(), 2)
        .stream_to_response(&sample_request())
        .await
        .unwrap();
    assert_eq!(r.message.text(), "Hello!");
    let seen = server.requests();
    assert!(seen[1].at - seen[0].at >= Duration::from_millis(110));
}

#[tokio::test]
async fn server_errors_are_retried_until_the_policy_gives_up() {
    let down = r#"{"type":"error","error":{"type":"api_error","message":"down"}}"#;
    let server = serve(vec![
        Reply::json(500, down),
        Reply::json(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#,
        ),
        Reply::json(200, ANTHROPIC_OK),
    ])
    .await;
    assert_eq!(
        anthropic(&server.url(), 3)
            .send(&sample_request())
            .await
            .unwrap()
            .message
            .text(),
        "Hello!"
    );
    assert_eq!(server.requests().len(), 3);

    let server = serve(vec![
        Reply::json(503, down),
        Reply::json(503, down),
        Reply::json(503, down),
        Reply::json(200, ANTHROPIC_OK),
    ])
    .await;
    let err = anthropic(&server.url(), 2)
        .send(&sample_request())
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "provider unavailable (HTTP 503): down");
    assert_eq!(server.requests().len(), 3, "one attempt and two retries");
}

/// A streamed request whose first answer's stream is `first`, retried once: the retry gets
/// the whole answer, and nothing of the first is delivered twice.
async fn retried(first: &str) {
    let server = serve(vec![Reply::sse(first), Reply::sse(&anthropic_sse())]).await;
    let r = anthropic(&server.url(), 2)
        .stream_to_response(&sample_request())
        .await
        .unwrap();
    assert_eq!(r.message.text(), "Hello!");
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn an_overloaded_event_before_any_content_is_retried_but_not_after() {
    let overloaded = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    retried(overloaded).await;
    // After `message_start` (and a ping) but before any content: still nothing of the
    // answer, so still retried — the events held back are not delivered twice.
    let sse = anthropic_sse();
    let before_content = sse.find("event: content_block_start").unwrap();
    retried(&format!("{}{overloaded}", &sse[..before_content])).await;

    let at = sse.find("event: content_block_stop").unwrap();
    let mid = format!("{}{overloaded}", &sse[..at]);
    let server = serve(vec![Reply::sse(&mid), Reply::sse(&anthropic_sse())]).await;
    let err = anthropic(&server.url(), 2)
        .stream_to_response(&sample_request())
        .await
        .unwrap_err();
    // Not called retryable, nor `overloaded` as if nothing had arrived.
    let text = err.to_string();
    assert!(
        text.starts_with("stream truncated after ")
            && text.ends_with(
                " events: the provider sent an error event: Overloaded; part of the answer had \
                 arrived, so it is not retried"
            ),
        "{text}"
    );
    assert!(!err.is_retryable());
    assert_eq!(
        server.requests().len(),
        1,
        "part of the answer was delivered: no retry"
    );
    // An `api_error` event: no `HTTP 500` the server never sent.
    let api_error = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n";
    let mid = format!("{}{api_error}", &sse[..at]);
    let server = serve(vec![Reply::sse(&mid)]).await;
    let err = anthropic(&server.url(), 2)
        .stream_to_response(&sample_request())
        .await
        .unwrap_err();
    assert!(
        err.to_string().ends_with(
            "events: the provider sent an error event: boom; part of the answer had arrived, so \
             it is not retried"
        ),
        "{err}"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn timeouts_name_what_was_awaited() {
    let server = serve(vec![Reply::Hang]).await;
    let backend = HttpBackend::anthropic(
        HttpConfig::new(server.url())
            .with_retry(RetryPolicy::none())
            .with_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    let started = Instant::now();
    let err = backend.send(&sample_request()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "timed out after 200ms waiting for response headers"
    );
    assert!(err.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(5));

    // A stall after `message_start` but before any content: nothing of the answer has
    // arrived, so it is the retryable `Timeout`; after the first content, a cut answer that
    // is not (sending again would give a second answer after the start of the first).
    let sse = anthropic_sse();
    let stalled_at = |marker: &str| {
        let at = sse.find(marker).unwrap();
        Reply::sse_chunks(
            vec![sse.as_bytes()[..at].to_vec(), sse.as_bytes()[at..].to_vec()],
            Duration::from_secs(3),
        )
    };
    let stream_err = |reply: Reply| async move {
        let server = serve(vec![reply]).await;
        let backend = HttpBackend::anthropic(
            HttpConfig::new(server.url())
                .with_retry(RetryPolicy::none())
                .with_idle_timeout(Duration::from_millis(200)),
        )
        .unwrap();
        backend
            .stream_to_response(&sample_request())
            .await
            .unwrap_err()
    };
    let err = stream_err(stalled_at("event: ping")).await;
    assert_eq!(
        err.to_string(),
        "timed out after 200ms waiting for the next stream event"
    );
    assert!(err.is_retryable());
    let err = stream_err(stalled_at("event: content_block_delta")).await;
    let text = err.to_string();
    assert!(
        text.starts_with("stream truncated after ")
            && text.ends_with(
                " events: no event came within 200ms; part of the answer had arrived, so it is \
                 not retried"
            ),
        "{text}"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_refused_connection_names_the_endpoint_but_never_the_key() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let backend = HttpBackend::anthropic(
        HttpConfig::new(format!("http://127.0.0.1:{port}"))
            .with_api_key("sk-ant-secret")
            .with_retry(RetryPolicy::none()),
    )
    .unwrap();
    let err = backend.send(&sample_request()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("connection to http://127.0.0.1:{port} failed")
    );
    assert!(err.is_retryable());
    let chain = format!("{err:?}");
    assert!(!chain.contains("sk-ant-secret"), "{chain}");
}

#[tokio::test]
async fn a_complete_stream_ignores_what_the_connection_does_next() {
    // The server keeps the connection open after message_stop, then sends junk.
    let server = serve(vec![Reply::sse_chunks(
        vec![anthropic_sse().into_bytes(), b"junk".to_vec()],
        Duration::from_secs(2),
    )])
    .await;
    let backend = HttpBackend::anthropic(
        HttpConfig::new(server.url())
            .with_retry(RetryPolicy::none())
            .with_idle_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    let r = backend.stream_to_response(&sample_request()).await.unwrap();
    assert_eq!(r.message.text(), "Hello!");
}

#[tokio::test]
async fn a_stream_that_ends_before_its_first_event_is_retried() {
    retried("").await;

    let server = serve(vec![Reply::sse("")]).await;
    let err = anthropic(&server.url(), 0)
        .stream_to_response(&sample_request())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("connection to {} failed", server.url())
    );
    assert_eq!(
        std::error::Error::source(&err).unwrap().to_string(),
        "the connection closed before the end-of-stream event"
    );
}

#[tokio::test]
async fn secrets_echoed_by_a_server_are_redacted() {
    let echo = r#"{"type":"error","error":{"type":"authentication_error","message":"bad key sk-ant-test for gateway token gw-secret-9"}}"#;
    let server = serve(vec![Reply::json(401, echo)]).await;
    let config = HttpConfig::new(server.url())
        .with_api_key("sk-ant-test")
        .with_header("x-gateway", "gw-secret-9")
        .with_retry(RetryPolicy::none());
    assert!(!format!("{config:?}").contains("gw-secret-9"), "{config:?}");
    let err = HttpBackend::anthropic(config)
        .unwrap()
        .send(&sample_request())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "authentication failed (HTTP 401): bad key <redacted> for gateway token <redacted>"
    );
    let err = HttpBackend::anthropic(HttpConfig::new("http://user:pw@[bad")).unwrap_err();
    assert!(!err.to_string().contains("pw"), "{err}");
}

#[tokio::test]
async fn a_huge_retry_after_is_capped_not_a_panic() {
    let limited = r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow"}}"#;
    let server = serve(vec![
        Reply::json(429, limited).with_header("retry-after", "1e300"),
    ])
    .await;
    let err = anthropic(&server.url(), 0)
        .send(&sample_request())
        .await
        .unwrap_err();
    // Too large to represent: the longest wait, which the policy caps (60 s by default) —
    // never less than a moderate request gets.
    assert_eq!(err.retry_after(), Some(Duration::MAX));
}

/// A redirect is not followed: the request carries the API key and the host's headers, which
/// another server would get, and a 301/302 would resend the POST as a GET whose answer would
/// pass for the model's. It is an error naming the endpoint and where it points (without the
/// credentials or query a `Location` may hold), not retried; the second server hears nothing.
#[tokio::test]
async fn a_redirect_is_an_error_and_sends_the_key_nowhere() {
    let elsewhere = serve(vec![Reply::json(200, ANTHROPIC_OK)]).await;
    for status in [301, 302, 307, 308] {
        let location = format!("{}/v1/messages?token=t0ken#x", elsewhere.url()).replacen(
            "http://",
            "http://user:pw@",
            1,
        );
        let server = serve(vec![
            Reply::json(status, "").with_header("location", &location),
        ])
        .await;
        let err = anthropic(&server.url(), 3)
            .send(&sample_request())
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "invalid request (HTTP {status}): {} answered with a redirect to \
                 `{}/v1/messages?…`, which is not followed (the request carries the API key, \
                 which a redirect would hand on, and a POST would become a GET): point the base \
                 URL at that server",
                server.url(),
                elsewhere.url()
            ),
            "HTTP {status}"
        );
        assert!(!err.is_retryable());
        assert_eq!(server.requests().len(), 1, "not retried");
    }
    assert!(elsewhere.requests().is_empty(), "the key went nowhere else");
    // However the `Location` is written, no credentials or query of it are shown.
    for (location, shown) in [
        ("//user:pw@evil.example/x?t=1", "http://evil.example/x?…"),
        // Not a URL at all (a port of `p`): shown as such, none of it repeated.
        (
            "http://user:p?ss@h.example/x",
            "(an address that is not a URL)",
        ),
        ("/v1/other", "/v1/other"),
    ] {
        let server = serve(vec![Reply::json(307, "").with_header("location", location)]).await;
        let err = anthropic(&server.url(), 0)
            .send(&sample_request())
            .await
            .unwrap_err()
            .to_string();
        assert!(!err.contains("pw") && !err.contains("ss@"), "{err}");
        let want = if shown.starts_with("/v1") {
            format!("{}{shown}", server.url())
        } else {
            shown.to_owned()
        };
        assert!(
            err.contains(&format!("a redirect to `{want}`")),
            "{location}: {err}"
        );
    }
}
