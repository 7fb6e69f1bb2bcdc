//! A server-sent-events decoder that tolerates any chunking and notices truncation.
//!
//! Written here rather than taken from a crate because the backends must tell a stream that
//! ended cleanly from one cut mid-event, and must do so for input split anywhere — down to
//! one byte per chunk.

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Incremental SSE decoder: feed bytes, take complete events.
#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
    has_fields: bool,
}

impl SseDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `bytes` and appends every event they complete to `out`.
    ///
    /// Invalid UTF-8 in a line is replaced (`U+FFFD`) rather than dropped.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) {
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + nl;
            let mut line = &self.buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            self.line(&line, out);
        }
        self.buf.drain(..start);
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.has_fields {
                out.push(SseEvent {
                    event: self.event.take(),
                    data: std::mem::take(&mut self.data).join("\n"),
                });
                self.has_fields = false;
            }
            return;
        }
        if line.starts_with(':') {
            return; // comment
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => {
                self.event = Some(value.to_owned());
                self.has_fields = true;
            }
            "data" => {
                self.data.push(value.to_owned());
                self.has_fields = true;
            }
            _ => {} // id, retry and unknown fields are ignored
        }
    }

    /// Whether bytes or fields of an unfinished event are pending: at end of stream this
    /// means the stream was cut mid-event.
    pub fn has_partial_event(&self) -> bool {
        self.has_fields || !self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const STREAM: &str = "event: message_start\ndata: {\"a\":1}\n\n: comment\n\nevent: ping\r\ndata: {}\r\n\r\ndata: line1\ndata: line2\n\n";

    fn decode_in(chunks: &[&[u8]]) -> (Vec<SseEvent>, bool) {
        let mut d = SseDecoder::new();
        let mut out = Vec::new();
        for c in chunks {
            d.feed(c, &mut out);
        }
        (out, d.has_partial_event())
    }

    #[test]
    fn decodes_events_comments_crlf_and_multiline_data() {
        let (events, partial) = decode_in(&[STREAM.as_bytes()]);
        assert!(!partial);
        assert_eq!(
            events,
            vec![
                SseEvent {
                    event: Some("message_start".into()),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    event: Some("ping".into()),
                    data: "{}".into()
                },
                SseEvent {
                    event: None,
                    data: "line1\nline2".into()
                },
            ]
        );
    }

    #[test]
    fn a_cut_stream_leaves_a_partial_event() {
        let cut = &STREAM.as_bytes()[..30];
        let (events, partial) = decode_in(&[cut]);
        assert_eq!(events.len(), 0);
        assert!(partial);
    }

    proptest! {
        #[test]
        fn any_chunking_gives_the_same_events(cuts in prop::collection::vec(0usize..STREAM.len(), 0..20)) {
            let bytes = STREAM.as_bytes();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let mut chunks = Vec::new();
            let mut last = 0;
            for c in cuts { chunks.push(&bytes[last..c]); last = c; }
            chunks.push(&bytes[last..]);
            prop_assert_eq!(decode_in(&chunks), decode_in(&[bytes]));
        }
    }
}
