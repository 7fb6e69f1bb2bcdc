//! `ReplayBackend`: answers recorded by `RecordingBackend`, matched by fingerprint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use forkhive_core::{CacheSafeParams, ForkPrefix, Message, RawJson, ToolDefinition, Usage};
use forkhive_transport::conformance::{check_error, check_round_trip, sample_request};
use forkhive_transport::recording::RecordingBackend;
use forkhive_transport::replay::ReplayBackend;
use forkhive_transport::request::events_for;
use forkhive_transport::{
    AnthropicCodec, Backend, BackendExt, BlockStart, EventStream, ModelStop, OpenAiCodec,
    PartialUsage, Request, Response, ResponseBuilder, ScriptedBackend, StreamEvent,
};
use forkhive_transport::{Error, Result};
use futures::StreamExt;

fn tool(name: &str, description: &str) -> ToolDefinition {
    ToolDefinition::new(
        name,
        description,
        r#"{"type":"object","properties":{"path":{"type":"string"}}}"#,
    )
    .unwrap()
}

fn params_with(system: &str, second_tool: &str) -> CacheSafeParams {
    CacheSafeParams::builder("claude-sonnet-4-5")
        .tool(tool("Read", "Read a file"))
        .tool(tool("Grep", second_tool))
        .system_block(system)
        .system_context("os", "linux")
        .user_context("cwd", "/repo")
        .messages(vec![Message::user_text("Audit the repository.")])
        .build()
}

fn params() -> CacheSafeParams {
    params_with("You are a careful engineer.", "Search files")
}

/// Answers with the last message's text reversed, so every request gets its own answer.
fn replier() -> ScriptedBackend {
    ScriptedBackend::from_fn(|r| {
        let last = r
            .all_messages()
            .last()
            .map(Message::text)
            .unwrap_or_default();
        let mut response = Response::text(
            last.chars().rev().collect::<String>(),
            Usage {
                input_tokens: 100 + r.all_messages().len() as u64,
                output_tokens: 7,
                cache_read_tokens: 40,
                ..Usage::default()
            },
        );
        response.id = Some(format!("msg_{}", last.len()));
        response.model = Some("claude-sonnet-4-5-20250929".into());
        Ok(response)
    })
}

fn recorder<B: Backend>(inner: B, dir: &Path) -> RecordingBackend<B> {
    RecordingBackend::new(inner, dir, Box::new(AnthropicCodec::default())).unwrap()
}

fn fork() -> ForkPrefix {
    ForkPrefix::new(params(), Message::assistant_text("Splitting the audit.")).unwrap()
}

fn child(prefix: &ForkPrefix, n: usize, directive: &str) -> Request {
    Request::fork(prefix.child(directive)).with_label(format!("child-{n}"))
}

#[tokio::test]
async fn a_run_replays_in_another_order_with_identical_answers() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recorder(replier(), dir.path());
    let parent = Request::new(params(), vec![]).with_label("parent");
    let prefix = fork();
    let children: Vec<Request> = ["audit src/net", "audit src/db", "audit src/ui"]
        .iter()
        .enumerate()
        .map(|(i, d)| child(&prefix, i + 1, d))
        .collect();

    let mut live = vec![rec.send(&parent).await.unwrap()];
    for (i, c) in children.iter().enumerate() {
        live.push(if i == 1 {
            rec.stream_to_response(c).await.unwrap()
        } else {
            rec.send(c).await.unwrap()
        });
    }

    let replay = ReplayBackend::open(dir.path()).unwrap();
    assert_eq!(replay.len(), 4);
    assert_eq!(
        replay.remaining(),
        [
            "0001-parent.json",
            "0002-child-1.json",
            "0003-child-2.json",
            "0004-child-3.json"
        ]
    );
    // The children in parallel and in reverse order, streamed and sent the other way round.
    let answers = futures::future::join_all(children.iter().enumerate().rev().map(|(i, c)| {
        let replay = &replay;
        async move {
            if i == 1 {
                replay.send(c).await
            } else {
                replay.stream_to_response(c).await
            }
        }
    }))
    .await;
    let answers: Vec<Response> = answers.into_iter().rev().map(Result::unwrap).collect();
    assert_eq!(answers, live[1..]);
    assert_eq!(replay.remaining(), ["0001-parent.json"]);
    assert_eq!(replay.send(&parent).await.unwrap(), live[0]);
    assert!(replay.remaining().is_empty());
    assert!(
        live[2]
            .message
            .text()
            .starts_with("bd/crs tidua :evitcerid-krof")
    );
}

#[tokio::test]
async fn a_request_recorded_twice_is_answered_in_order_then_reported_used() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recorder(ScriptedBackend::from_texts(["first", "second"]), dir.path());
    rec.send(&sample_request()).await.unwrap();
    rec.send(&sample_request()).await.unwrap();
    let replay = ReplayBackend::open(dir.path()).unwrap();
    assert_eq!(
        replay.send(&sample_request()).await.unwrap().message.text(),
        "first"
    );
    assert_eq!(
        replay.send(&sample_request()).await.unwrap().message.text(),
        "second"
    );
    let err = replay.send(&sample_request()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "no recording matches request 3: 0001-request.json (and 1 more) match it but were already used"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_changed_system_prompt_names_the_closest_recording_and_the_block() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recorder(replier(), dir.path());
    rec.send(&Request::new(params(), vec![]).with_label("parent"))
        .await
        .unwrap();
    let replay = ReplayBackend::open(dir.path()).unwrap();
    let changed = Request::new(
        params_with("You are a careless engineer.", "Search files"),
        vec![],
    );
    let err = replay.send(&changed).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "no recording matches request 1: closest is 0001-parent.json, which differs at system prompt block 0 changed"
    );
    let Error::NoRecording {
        request, closest, ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(
        (*request, closest.as_deref()),
        (1, Some("0001-parent.json"))
    );
    // The mismatch used nothing up.
    assert_eq!(replay.remaining(), ["0001-parent.json"]);
}

#[tokio::test]
async fn a_changed_tool_is_named_by_index() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recorder(replier(), dir.path());
    rec.send(&Request::new(params(), vec![])).await.unwrap();
    let replay = ReplayBackend::open(dir.path()).unwrap();
    let changed = Request::new(
        params_with("You are a careful engineer.", "Search files by regex"),
        vec![],
    );
    let err = replay.stream(&changed).await.err().unwrap();
    assert_eq!(
        err.to_string(),
        "no recording matches request 1: closest is 0001-request.json, which differs at tools[1] changed"
    );
}

#[tokio::test]
async fn a_new_directive_is_closest_to_an_unused_sibling() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recorder(replier(), dir.path());
    let prefix = fork();
    rec.send(&Request::new(params(), vec![]).with_label("parent"))
        .await
        .unwrap();
    rec.send(&child(&prefix, 1, "audit src/net")).await.unwrap();
    rec.send(&child(&prefix, 2, "audit src/db")).await.unwrap();
    // A longer conversation too, so that the request is shorter than one recording.
    let long = Request::new(
        params(),
        vec![
            Message::assistant_text("On it."),
            Message::user_text("Go on."),
            Message::assistant_text("Done."),
            Message::user_text("Thanks."),
        ],
    )
    .with_label("long");
    rec.send(&long).await.unwrap();

    let replay = ReplayBackend::open(dir.path()).unwrap();
    replay
        .send(&child(&prefix, 1, "audit src/net"))
        .await
        .unwrap();
    let err = replay
        .send(&child(&prefix, 3, "audit src/ui"))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "no recording matches request 2: closest is 0003-child-2.json, which differs at messages[2] changed"
    );
    // Shorter than `long`, sharing its first four messages.
    let mut shorter = long.all_messages();
    shorter.truncate(4);
    let err = replay
        .send(&Request::new(params(), shorter[1..].to_vec()))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "no recording matches request 3: closest is 0004-long.json, which differs at messages[4] removed"
    );
    // Longer than `long`: the recording is a prefix of the request.
    let mut longer = long.all_messages();
    longer.push(Message::assistant_text("You're welcome."));
    let err = replay
        .send(&Request::new(params(), longer[1..].to_vec()))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "no recording matches request 4: closest is 0004-long.json, which differs at messages[5] added"
    );
}

#[tokio::test]
async fn malformed_and_foreign_files_are_typed_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let open_with = |name: &str, text: &str| {
        let d = tempfile::tempdir_in(dir.path()).unwrap();
        let path = d.path().join(name);
        std::fs::write(&path, text).unwrap();
        // Files not named `<seq>-<label>.json` are ignored.
        std::fs::write(d.path().join("README.md"), "recordings").unwrap();
        std::fs::write(d.path().join("notes.json"), "{").unwrap();
        let err = ReplayBackend::open(d.path()).unwrap_err();
        assert!(!err.is_retryable());
        assert!(matches!(err, Error::MalformedRecording { .. }), "{err:?}");
        (err.to_string(), path.display().to_string())
    };

    let (err, path) = open_with("0001-cut.json", r#"{"model":"#);
    assert_eq!(
        err,
        format!(
            "malformed recording {path}: not a JSON object: EOF while parsing a value at line 1 column 9"
        )
    );
    let (err, path) = open_with("0001-old.json", r#"{"model":"m","messages":[]}"#);
    assert_eq!(
        err,
        format!(
            "malformed recording {path}: no `forkhive` section and no `0001-old.meta.json` \
             beside it: the file holds only a request body, so there is nothing to replay"
        )
    );
    let (err, path) = open_with("0007-new.meta.json", r#"{"format":3}"#);
    assert_eq!(
        err,
        format!(
            "malformed recording {path}: recording format 3 is not supported here (this build \
             reads format 2 in `<seq>-<label>.meta.json` files, and format 1 in the body's \
             `forkhive` key)"
        )
    );
    let (err, path) = open_with(
        "0001-bad.json",
        "{\"forkhive\":{\"format\":1,\n\"request\":{\"model\":\"m\",\"messages\":7}}}",
    );
    assert_eq!(
        err,
        format!(
            "malformed recording {path}: bad `forkhive` section: invalid type: integer `7`, expected a sequence at line 2 column 35"
        )
    );

    // A real recording whose answer never came, or whose request was edited.
    let rec_dir = tempfile::tempdir().unwrap();
    recorder(replier(), rec_dir.path())
        .send(&sample_request())
        .await
        .unwrap();
    let recorded = std::fs::read_to_string(rec_dir.path().join("0001-request.meta.json")).unwrap();
    // Edited as text: a `serde_json::Value` would reorder the keys of the tool's schema.
    let unanswered = format!(
        "{}}}",
        &recorded[..recorded.find(r#","response":"#).unwrap()]
    );
    let (err, path) = open_with("0001-request.meta.json", &unanswered);
    assert_eq!(
        err,
        format!(
            "malformed recording {path}: it holds no `response` or `error`: the recorded run \
             stopped before the answer was complete"
        )
    );
    let edited = recorded.replace(
        r#""system":["Answer briefly."]"#,
        r#""system":["Answer at length."]"#,
    );
    assert_ne!(edited, recorded);
    let (err, path) = open_with("0001-request.meta.json", &edited);
    let digest = |s: &str| s.get(..12).unwrap().to_owned();
    let rebuilt = CacheSafeParams::builder("conformance-model")
        .tool(sample_request().prefix.tools()[0].clone())
        .system_block("Answer at length.")
        .messages(vec![Message::user_text("Say hello.")])
        .build();
    assert_eq!(
        err,
        format!(
            "malformed recording {path}: its request fingerprints as {} but the recording says {}: \
             the request was edited (delete `fingerprint` to accept the edit), or recorded by a \
             forkhive that fingerprints differently",
            digest(&rebuilt.fingerprint().total().to_string()),
            digest(&sample_request().fingerprint().total().to_string()),
        )
    );
    // Without `fingerprint`, the edit is accepted and the edited request matches.
    let start = edited.find(r#","fingerprint":{"#).unwrap();
    let end = start + edited[start..].find('}').unwrap() + 1;
    let accepted = format!("{}{}", &edited[..start], &edited[end..]);
    let dir2 = tempfile::tempdir().unwrap();
    std::fs::write(dir2.path().join("0001-edited.meta.json"), accepted).unwrap();
    std::fs::copy(
        rec_dir.path().join("0001-request.json"),
        dir2.path().join("0001-edited.json"),
    )
    .unwrap();
    let replay = ReplayBackend::open(dir2.path()).unwrap();
    replay
        .send(&Request::new(rebuilt, vec![]).with_max_tokens(16))
        .await
        .unwrap();

    let missing = dir.path().join("missing");
    let err = ReplayBackend::open(&missing).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("could not read {} for replay", missing.display())
    );
    assert!(matches!(err, Error::ReplayRead { .. }));
}

/// A recording's body file — the bytes `curl` resends and `diff` compares — is checked when
/// the recording is opened: a body cut, reformatted or deleted since it was recorded is
/// refused, naming it; one from before bodies were digested (no `body_sha256`) needs only to
/// be there.
#[tokio::test]
async fn a_body_changed_since_it_was_recorded_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    recorder(replier(), dir.path())
        .send(&sample_request())
        .await
        .unwrap();
    let body_path = dir.path().join("0001-request.json");
    let meta_path = dir.path().join("0001-request.meta.json");
    let body = std::fs::read(&body_path).unwrap();
    let meta = std::fs::read_to_string(&meta_path).unwrap();
    assert!(ReplayBackend::open(dir.path()).is_ok());
    let recorded = forkhive_core::Digest::of(&body).to_string();
    assert!(
        meta.contains(&format!("\"body_sha256\":\"{recorded}\"")),
        "{meta}"
    );
    let refused = |why: String| format!("malformed recording {}: {why}", meta_path.display());
    let open_err = || ReplayBackend::open(dir.path()).unwrap_err().to_string();
    // Cut, and reformatted (the same JSON, other bytes).
    let pretty =
        serde_json::to_vec_pretty(&serde_json::from_slice::<serde_json::Value>(&body).unwrap())
            .unwrap();
    for changed in [body[..body.len() / 2].to_vec(), pretty] {
        std::fs::write(&body_path, &changed).unwrap();
        let found = forkhive_core::Digest::of(&changed).to_string();
        assert_eq!(
            open_err(),
            refused(format!(
                "its body 0001-request.json is not the one recorded (SHA-256 {} where the \
                 recording says {}): it was edited or cut since; record again, or delete \
                 `body_sha256` to accept it",
                &found[..12],
                &recorded[..12]
            ))
        );
    }
    std::fs::remove_file(&body_path).unwrap();
    assert_eq!(
        open_err(),
        refused(
            "its body 0001-request.json cannot be read: No such file or directory (os error 2)"
                .to_owned()
        )
    );
    // Without `body_sha256` (an earlier recording), the body only has to be there.
    let start = meta.find(",\"body_sha256\":").unwrap();
    let end = start + meta[start + 1..].find(',').unwrap() + 1;
    std::fs::write(&meta_path, format!("{}{}", &meta[..start], &meta[end..])).unwrap();
    std::fs::write(&body_path, b"{}").unwrap();
    let replay = ReplayBackend::open(dir.path()).unwrap();
    replay.send(&sample_request()).await.unwrap();
}

#[tokio::test]
async fn an_empty_directory_replays_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let replay = ReplayBackend::open(dir.path()).unwrap();
    assert!(replay.is_empty());
    let err = replay.send(&sample_request()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "no recording matches request 1: {} holds no recordings",
            dir.path().display()
        )
    );
}

#[tokio::test]
async fn streaming_replays_the_recorded_answer_as_events() {
    let dir = tempfile::tempdir().unwrap();
    let rec =
        RecordingBackend::new(replier(), dir.path(), Box::new(OpenAiCodec::default())).unwrap();
    let request = Request::new(params(), vec![]);
    let live = rec.stream_to_response(&request).await.unwrap();
    let replay = ReplayBackend::open(dir.path()).unwrap();
    let events: Vec<StreamEvent> = replay
        .stream(&request)
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(events, events_for(&live, 16));
    assert!(events.len() > 4);
    let mut builder = ResponseBuilder::new();
    for e in &events {
        builder.push(e).unwrap();
    }
    assert_eq!(builder.finish().unwrap(), live);
}

#[tokio::test]
async fn replay_conforms() {
    let hello = || {
        ScriptedBackend::from_fn(|_| {
            Ok(Response::text(
                "Hello!",
                Usage {
                    input_tokens: 20,
                    output_tokens: 2,
                    ..Usage::default()
                },
            ))
        })
    };
    let dir = tempfile::tempdir().unwrap();
    check_round_trip(&recorder(hello(), dir.path()), &sample_request())
        .await
        .unwrap();
    let replay = ReplayBackend::open(dir.path()).unwrap();
    check_round_trip(&replay, &sample_request()).await.unwrap();
    assert!(replay.remaining().is_empty());

    let failing = ScriptedBackend::from_fn(|_| Err(Error::from_status(529, "busy".into(), None)));
    let dir = tempfile::tempdir().unwrap();
    check_error(&recorder(failing, dir.path()), &sample_request(), |e| {
        matches!(e, Error::Overloaded { .. })
    })
    .await
    .unwrap();
    let replay = ReplayBackend::open(dir.path()).unwrap();
    let err = check_error(&replay, &sample_request(), |e| {
        matches!(e, Error::Overloaded { .. })
    })
    .await
    .unwrap();
    assert_eq!(err.to_string(), "provider overloaded: busy");
    assert!(replay.remaining().is_empty());
}

#[tokio::test]
async fn recorded_errors_replay_with_their_kind_and_retry_hint() {
    let errors = || {
        vec![
            Error::from_status(429, "slow down".into(), Some(Duration::from_millis(2500))),
            Error::from_status(401, "bad key".into(), None),
            Error::Timeout {
                after: Duration::from_secs(30),
                waiting_for: "response headers",
            },
            Error::Connect {
                endpoint: "https://api.example.com:443".into(),
                source: Box::new(std::io::Error::other("connection refused")),
            },
            Error::Provider {
                error_type: "weird_error".into(),
                message: "odd".into(),
            },
            Error::Decode {
                what: "Anthropic response",
                detail: "expected value".into(),
            },
        ]
    };
    let dir = tempfile::tempdir().unwrap();
    let rec = recorder(
        ScriptedBackend::from_replies(errors().into_iter().map(Err)),
        dir.path(),
    );
    let ask = |i: usize| Request::new(params(), vec![Message::assistant_text(format!("{i}"))]);
    for i in 0..errors().len() {
        rec.send(&ask(i)).await.unwrap_err();
    }
    let file = std::fs::read_to_string(dir.path().join("0001-request.meta.json")).unwrap();
    assert!(
        file.ends_with(
            r#","error":{"kind":"rate_limited","message":"slow down","retry_after_ms":2500}}
"#
        ),
        "{file}"
    );
    let replay = ReplayBackend::open(dir.path()).unwrap();
    for (i, expected) in errors().into_iter().enumerate().rev() {
        let got = replay.send(&ask(i)).await.unwrap_err();
        assert_eq!(got.to_string(), expected.to_string());
        assert_eq!(got.is_retryable(), expected.is_retryable(), "{got:?}");
        assert_eq!(got.retry_after(), expected.retry_after());
        assert_eq!(
            std::mem::discriminant(&got),
            std::mem::discriminant(&expected)
        );
    }
}

/// Streams fixed events, as a provider cut off at `max_tokens` would.
#[derive(Debug)]
struct Events(Vec<StreamEvent>);

#[async_trait::async_trait]
impl Backend for Events {
    async fn send(&self, _: &Request) -> Result<Response> {
        Err(Error::Config("stream only".into()))
    }

    async fn stream(&self, _: &Request) -> Result<EventStream> {
        Ok(Box::pin(futures::stream::iter(
            self.0.clone().into_iter().map(Ok),
        )))
    }
}

fn cut_off_events() -> Vec<StreamEvent> {
    vec![
        StreamEvent::MessageStart {
            id: Some("msg_cut".into()),
            model: Some("m".into()),
            usage: PartialUsage {
                input_tokens: Some(30),
                ..PartialUsage::default()
            },
        },
        StreamEvent::BlockStart {
            index: 0,
            block: BlockStart::ToolUse {
                id: "ok".into(),
                name: "Read".into(),
            },
        },
        StreamEvent::InputJsonDelta {
            index: 0,
            partial_json: r#"{"path": "a.rs"}"#.into(),
        },
        StreamEvent::BlockStop { index: 0 },
        StreamEvent::BlockStart {
            index: 1,
            block: BlockStart::ToolUse {
                id: "cut".into(),
                name: "Read".into(),
            },
        },
        StreamEvent::InputJsonDelta {
            index: 1,
            partial_json: r#"{"path":"src/ma"#.into(),
        },
        StreamEvent::MessageDelta {
            stop_reason: Some(ModelStop::MaxTokens),
            usage: PartialUsage {
                output_tokens: Some(16),
                ..PartialUsage::default()
            },
        },
        StreamEvent::MessageStop,
    ]
}

async fn fold_cut_off(backend: &dyn Backend, request: &Request) -> (Response, Vec<String>) {
    let mut stream = backend.stream(request).await.unwrap();
    let mut builder = ResponseBuilder::new();
    while let Some(e) = stream.next().await {
        builder.push(&e.unwrap()).unwrap();
    }
    builder.finish_cut_off().unwrap()
}

#[tokio::test]
async fn a_tool_call_cut_off_at_max_tokens_replays_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let rec = recorder(Events(cut_off_events()), dir.path());
    let request = sample_request();
    let live = fold_cut_off(&rec, &request).await;
    assert_eq!(live.1, ["cut"]);
    assert_eq!(
        live.0.message.tool_uses().next().map(|(_, _, i)| i.clone()),
        Some(RawJson::parse(r#"{"path": "a.rs"}"#).unwrap())
    );
    let replay = ReplayBackend::open(dir.path()).unwrap();
    assert_eq!(fold_cut_off(&replay, &request).await, live);
}

#[tokio::test]
async fn a_stream_that_ends_early_replays_as_the_same_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut events = cut_off_events();
    events.pop();
    let rec = recorder(Events(events), dir.path());
    let live = rec.stream_to_response(&sample_request()).await.unwrap_err();
    let replay = ReplayBackend::open(dir.path()).unwrap();
    let replayed = replay
        .stream_to_response(&sample_request())
        .await
        .unwrap_err();
    assert_eq!(replayed.to_string(), live.to_string());
    assert_eq!(
        live.to_string(),
        "stream truncated after 7 events: the stream ended without a message_stop event"
    );
}

#[tokio::test]
async fn the_request_is_on_disk_before_it_is_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("0001-request.meta.json");
    let (seen, body) = (path.clone(), dir.path().join("0001-request.json"));
    let inner = ScriptedBackend::from_fn(move |_| {
        let text = std::fs::read_to_string(&seen).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["request"]["model"], "conformance-model");
        assert!(value.get("response").is_none());
        let body: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&body).unwrap()).unwrap();
        assert_eq!(body["model"], "conformance-model");
        Ok(Response::text("ok", Usage::default()))
    });
    recorder(inner, dir.path())
        .send(&sample_request())
        .await
        .unwrap();
    let value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(value["response"]["message"]["content"][0]["text"], "ok");
}

/// The switch `docs/replay.md` shows: record against the real API when `FORKHIVE_RECORD` is
/// set, replay otherwise.
#[cfg(feature = "http")]
fn model_backend(dir: &Path) -> Result<Arc<dyn Backend>> {
    use forkhive_transport::http::HttpBackend;
    if std::env::var_os("FORKHIVE_RECORD").is_some() {
        let live = HttpBackend::anthropic_from_env()?;
        let codec = Box::new(AnthropicCodec::default());
        Ok(Arc::new(RecordingBackend::new(live, dir, codec)?))
    } else {
        Ok(Arc::new(ReplayBackend::open(dir)?))
    }
}

#[cfg(feature = "http")]
#[tokio::test]
async fn the_documented_switch_replays_by_default() {
    if std::env::var_os("FORKHIVE_RECORD").is_some() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    recorder(replier(), dir.path())
        .send(&sample_request())
        .await
        .unwrap();
    let backend = model_backend(dir.path()).unwrap();
    assert_eq!(
        backend
            .send(&sample_request())
            .await
            .unwrap()
            .message
            .text(),
        ".olleh yaS"
    );
}

/// Recordings of the earlier layout — one file, the body with a `forkhive` key — still replay.
#[tokio::test]
async fn format_one_recordings_still_replay() {
    let rec_dir = tempfile::tempdir().unwrap();
    recorder(replier(), rec_dir.path())
        .send(&sample_request())
        .await
        .unwrap();
    let body = std::fs::read_to_string(rec_dir.path().join("0001-request.json")).unwrap();
    let meta = std::fs::read_to_string(rec_dir.path().join("0001-request.meta.json")).unwrap();
    let meta = meta
        .trim_end()
        .replacen(r#"{"format":2,"#, r#"{"format":1,"#, 1);
    let old = format!("{},\"forkhive\":{meta}}}", &body[..body.len() - 1]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("0001-request.json"), old).unwrap();
    let replay = ReplayBackend::open(dir.path()).unwrap();
    assert_eq!(replay.remaining(), ["0001-request.json"]);
    replay.send(&sample_request()).await.unwrap();
}

/// A second run into a directory that holds recordings would interleave two runs: refused.
#[test]
fn recording_into_a_directory_with_recordings_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("0001-parent.json"), "{}").unwrap();
    std::fs::write(dir.path().join("notes.md"), "x").unwrap();
    let err = RecordingBackend::new(
        replier(),
        dir.path(),
        Box::new(forkhive_transport::AnthropicCodec::default()),
    )
    .unwrap_err();
    assert_eq!(
        forkhive_core::error::chain(&err),
        format!(
            "could not record to {}: the directory holds recordings already; record \
             into an empty one",
            dir.path().join("0001-parent.json").display()
        )
    );
    let empty = tempfile::tempdir().unwrap();
    std::fs::write(empty.path().join("notes.md"), "x").unwrap();
    assert!(
        RecordingBackend::new(
            replier(),
            empty.path(),
            Box::new(forkhive_transport::AnthropicCodec::default())
        )
        .is_ok()
    );
}
