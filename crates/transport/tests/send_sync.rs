//! Public types and futures are `Send`/`Sync` where a multi-threaded host needs them.
#![allow(clippy::unwrap_used)]

use forkhive_core::{CacheSafeParams, ForkChild, ForkPrefix, PrefixFingerprint, TaskNotification};
use forkhive_transport::recording::RecordingBackend;
use forkhive_transport::replay::ReplayBackend;
use forkhive_transport::simulator::PromptCacheSimulator;
use forkhive_transport::{Backend, EventStream, Request, Response, ScriptedBackend};

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>(_: &T) {}

#[test]
fn types_are_send_and_sync() {
    send_sync::<CacheSafeParams>();
    send_sync::<ForkPrefix>();
    send_sync::<ForkChild>();
    send_sync::<PrefixFingerprint>();
    send_sync::<TaskNotification>();
    send_sync::<Request>();
    send_sync::<Response>();
    send_sync::<ScriptedBackend>();
    send_sync::<PromptCacheSimulator<ScriptedBackend>>();
    send_sync::<RecordingBackend<ScriptedBackend>>();
    send_sync::<ReplayBackend>();
    send_sync::<std::sync::Arc<dyn Backend>>();
    #[cfg(feature = "http")]
    send_sync::<forkhive_transport::http::HttpBackend>();
    fn stream_is_send(_: EventStream) -> impl Send {}
    let _ = stream_is_send;
}

#[test]
fn backend_futures_are_send() {
    let backend: std::sync::Arc<dyn Backend> =
        std::sync::Arc::new(ScriptedBackend::from_texts(["a"]));
    let request = Request::new(CacheSafeParams::builder("m").build(), vec![]);
    send(&backend.send(&request));
    send(&backend.stream(&request));
}
