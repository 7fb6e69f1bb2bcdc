//! The conformance suite for the in-memory backends and wrappers, and the recording wrapper's
//! file handling.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use forkhive_core::{ForkPrefix, Message, Usage};
use forkhive_transport::conformance::{check_error, check_round_trip, sample_request};
use forkhive_transport::recording::RecordingBackend;
use forkhive_transport::simulator::PromptCacheSimulator;
use forkhive_transport::{
    AnthropicCodec, Backend, Codec, Error, OpenAiCodec, Response, ScriptedBackend,
};

fn hello() -> ScriptedBackend {
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
}

fn failing() -> ScriptedBackend {
    ScriptedBackend::from_fn(|_| Err(Error::from_status(529, "busy".into(), None)))
}

#[tokio::test]
async fn scripted_backend_conforms() {
    check_round_trip(&hello(), &sample_request()).await.unwrap();
    check_error(&failing(), &sample_request(), |e| {
        matches!(e, Error::Overloaded { .. })
    })
    .await
    .unwrap();
    let empty = ScriptedBackend::from_texts(Vec::<String>::new());
    let err = check_error(&empty, &sample_request(), |e| {
        matches!(e, Error::ScriptExhausted { .. })
    })
    .await
    .unwrap();
    assert_eq!(
        err.to_string(),
        "scripted backend has no reply for request #1 (script held 0)"
    );
}

#[tokio::test]
async fn scripted_backend_records_requests_and_sees_them() {
    let b = ScriptedBackend::from_fn(|r| {
        Ok(Response::text(
            format!("{} messages", r.all_messages().len()),
            Usage {
                output_tokens: 1,
                ..Usage::default()
            },
        ))
    });
    let r = b.send(&sample_request()).await.unwrap();
    assert_eq!(r.message.text(), "1 messages");
    assert_eq!(b.requests().len(), 1);
    assert_eq!(b.requests()[0].settings.max_tokens, 16);
}

#[tokio::test]
async fn simulator_conforms_for_both_providers() {
    check_round_trip(&PromptCacheSimulator::anthropic(hello()), &sample_request())
        .await
        .unwrap();
    check_round_trip(&PromptCacheSimulator::openai(hello()), &sample_request())
        .await
        .unwrap();
    check_error(
        &PromptCacheSimulator::anthropic(failing()),
        &sample_request(),
        |e| matches!(e, Error::Overloaded { .. }),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn recording_conforms_and_writes_numbered_labelled_bodies() {
    let dir = tempfile::tempdir().unwrap();
    let rec =
        RecordingBackend::new(hello(), dir.path(), Box::new(AnthropicCodec::default())).unwrap();
    check_round_trip(&rec, &sample_request()).await.unwrap();
    let prefix = ForkPrefix::new(
        sample_request().prefix,
        Message::assistant_text("splitting"),
    )
    .unwrap();
    rec.send(&forkhive_transport::Request::fork(prefix.child("x")).with_label("child 1/../x"))
        .await
        .unwrap();
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "0001-request.json",
            "0001-request.meta.json",
            "0002-request.json",
            "0002-request.meta.json",
            "0003-child_1____x.json",
            "0003-child_1____x.meta.json"
        ]
    );
    // The body file is exactly what the provider received: sendable as it is.
    let first = std::fs::read(dir.path().join("0001-request.json")).unwrap();
    let body = AnthropicCodec::default()
        .encode(&sample_request(), false)
        .to_bytes();
    assert_eq!(first, body);
    let meta = |name: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(dir.path().join(name)).unwrap()).unwrap()
    };
    let section = meta("0001-request.meta.json");
    assert_eq!(section["format"], 2);
    assert_eq!(section["seq"], 1);
    assert_eq!(section["wire"], "anthropic");
    assert_eq!(section["stream"], false);
    assert_eq!(
        section["fingerprint"]["total"],
        sample_request().fingerprint().total().to_string()
    );
    assert_eq!(section["request"]["model"], "conformance-model");
    assert_eq!(section["request"]["system"][0], "Answer briefly.");
    assert_eq!(section["request"]["tools"][0]["name"], "Read");
    assert_eq!(section["request"]["settings"]["max_tokens"], 16);
    assert_eq!(
        section["response"]["message"]["content"][0]["text"],
        "Hello!"
    );
    assert_eq!(section["response"]["stop_reason"], "end_turn");
    assert_eq!(section["response"]["usage"]["input_tokens"], 20);
    let second_body = std::fs::read_to_string(dir.path().join("0002-request.json")).unwrap();
    assert!(second_body.ends_with(r#","stream":true}"#), "{second_body}");
    let second = meta("0002-request.meta.json");
    assert_eq!(second["stream"], true);
    assert_eq!(second["response"], section["response"]);
    let third = meta("0003-child_1____x.meta.json");
    assert_eq!(third["label"], "child 1/../x");
    assert_eq!(third["request"]["prefix_messages"], 0);
    assert_eq!(third["request"]["messages"].as_array().unwrap().len(), 2);

    let openai = RecordingBackend::new(
        hello(),
        tempfile::tempdir().unwrap().keep(),
        Box::new(OpenAiCodec::default()),
    )
    .unwrap();
    openai.send(&sample_request()).await.unwrap();
    let body: serde_json::Value =
        serde_json::from_slice(&std::fs::read(openai.dir().join("0001-request.json")).unwrap())
            .unwrap();
    assert_eq!(body["messages"][0]["role"], "system");
}

#[cfg(unix)]
#[tokio::test]
async fn recording_never_follows_a_planted_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("victim.txt");
    std::fs::write(&target, "precious").unwrap();
    let rec =
        RecordingBackend::new(hello(), dir.path(), Box::new(AnthropicCodec::default())).unwrap();
    // Planted after the recorder checked the directory, before its first write.
    std::os::unix::fs::symlink(&target, dir.path().join("0001-request.json")).unwrap();
    let err = rec.send(&sample_request()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "could not record to {}",
            dir.path().join("0001-request.json").display()
        )
    );
    let Error::Record { source, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(source.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
}

#[tokio::test]
async fn recording_into_a_missing_or_non_directory_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let err =
        RecordingBackend::new(hello(), &missing, Box::new(AnthropicCodec::default())).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("could not record to {}", missing.display())
    );
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let err =
        RecordingBackend::new(hello(), &file, Box::new(AnthropicCodec::default())).unwrap_err();
    let Error::Record { source, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(source.kind(), std::io::ErrorKind::NotADirectory);
}

/// Whether a backend answers whole is the scripted backend's choice, and the simulator and the
/// recorder say what the backend they wrap says; a whole answer is the scripted one, unchanged.
#[tokio::test]
async fn wrappers_answer_whole_when_what_they_wrap_does() {
    assert!(!hello().answers_whole());
    assert!(hello().answering_whole().answers_whole());
    assert!(!PromptCacheSimulator::anthropic(hello()).answers_whole());
    assert!(PromptCacheSimulator::anthropic(hello().answering_whole()).answers_whole());
    let dir = tempfile::tempdir().unwrap();
    let rec = RecordingBackend::new(
        hello().answering_whole(),
        dir.path(),
        Box::new(AnthropicCodec::default()),
    )
    .unwrap();
    assert!(rec.answers_whole());
    let whole = hello().answering_whole();
    let answer = check_round_trip(&whole, &sample_request()).await.unwrap();
    assert_eq!(answer.message.text(), "Hello!");
}
