//! Byte-level JSON helpers shared by the fingerprints and the wire codecs.
//!
//! Everything here produces exactly the bytes `serde_json` produces for the same value, so a
//! prefix encoded by hand and a value serialised by `serde_json` can be spliced together.

/// Appends `n` in decimal to `out`: the text `Display` (and a JSON number) writes, without the
/// formatting machinery. For text built once per request or per child (labels, notifications).
///
/// ```
/// let mut out = String::from("turn-");
/// forkhive_core::json::push_decimal(&mut out, 4_096);
/// assert_eq!(out, "turn-4096");
/// ```
pub fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    if let Ok(text) = std::str::from_utf8(&digits[at..]) {
        out.push_str(text);
    }
}

/// Appends the JSON string escape of `s` to `out`, without the surrounding quotes.
///
/// The escapes are `serde_json`'s: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, and `\u00xx`
/// (lowercase hex) for the remaining control characters; everything else is copied as UTF-8.
///
/// ```
/// let mut out = Vec::new();
/// forkhive_core::json::escape_str_into(&mut out, "say \"hi\"\n");
/// assert_eq!(out, br#"say \"hi\"\n"#);
/// ```
pub fn escape_str_into(out: &mut Vec<u8>, s: &str) {
    escape_str_chunks(s, |chunk| out.extend_from_slice(chunk));
}

/// Feeds the JSON string escape of `s` to `emit` in chunks, without allocating.
///
/// Concatenating the chunks gives exactly what [`escape_str_into`] appends; this form lets a
/// hasher consume the escape directly.
pub fn escape_str_chunks(s: &str, mut emit: impl FnMut(&[u8])) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => {
                emit(&bytes[start..i]);
                emit(&[
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ]);
                start = i + 1;
                continue;
            }
            _ => continue,
        };
        emit(&bytes[start..i]);
        emit(short);
        start = i + 1;
    }
    emit(&bytes[start..]);
}

/// Appends `s` as a quoted JSON string to `out`.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    escape_str_into(out, s);
    out.push(b'"');
}

#[cfg(test)]
mod tests {

    #[test]
    fn push_decimal_writes_what_display_writes() {
        for n in [
            0,
            7,
            10,
            99,
            100,
            4_096,
            1_000_000,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut out = String::from("x-");
            super::push_decimal(&mut out, n);
            assert_eq!(out, format!("x-{n}"));
        }
    }

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes_every_control_character_like_serde_json() {
        for c in 0u8..0x80 {
            let s = char::from(c).to_string();
            let mut ours = Vec::new();
            write_str(&mut ours, &s);
            let theirs = serde_json::to_vec(&s).unwrap_or_default();
            assert_eq!(ours, theirs, "byte {c:#04x}");
        }
    }

    proptest! {
        #[test]
        fn matches_serde_json_for_any_string(s in any::<String>()) {
            let mut ours = Vec::new();
            write_str(&mut ours, &s);
            prop_assert_eq!(ours, serde_json::to_vec(&s).unwrap_or_default());
        }
    }
}
