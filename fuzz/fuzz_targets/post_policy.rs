//! POST policies (browser form uploads): parsing a policy never panics, whether the bytes
//! arrive base64-encoded (as the `policy` field carries them) or as raw text; a parsed
//! policy is unexpired, bounded, and its conditions print as S3 quotes them and parse back
//! the same; checking a form never panics; and no form made of the input verifies.
#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use yutu_api::post_policy::{
    credential, success_action_status, success_redirect, verify, FormFields, PolicyDocument,
    MAX_CONDITIONS, MAX_POLICY_LEN,
};

/// Standard base64 with padding: the fuzz crate has no base64 dependency of its own.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn exercise(doc: &PolicyDocument, now: SystemTime, fields: &FormFields, size: u64) {
    assert!(doc.expiration() > now, "an expired policy parsed");
    assert!(doc.conditions().len() <= MAX_CONDITIONS);

    let _ = doc.check(fields, size);
    let _ = doc.check_fields(fields);
    if doc.check_content_length(size).is_ok() {
        if let Some((min, max)) = doc.content_length_range() {
            assert!(min <= size && size <= max, "{size} outside {min}..={max}");
        }
    }

    // Conditions print in array form, which parses back to the same conditions.
    let listed: Vec<String> = doc.conditions().iter().map(|c| c.to_string()).collect();
    let json = format!(
        r#"{{"expiration": "2999-01-01T00:00:00Z", "conditions": [{}]}}"#,
        listed.join(", ")
    );
    if json.len() <= MAX_POLICY_LEN {
        match PolicyDocument::from_json(json.as_bytes(), now) {
            Ok(again) => assert_eq!(again.conditions(), doc.conditions(), "{json}"),
            Err(e) => panic!("{json} does not parse back: {e}"),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let text = String::from_utf8_lossy(data);

    // A form of the input's lines, `name=value`, and a bucket from the URL.
    let mut fields = FormFields::new();
    for line in text.lines().take(64) {
        let (name, value) = line.split_once('=').unwrap_or((line, ""));
        let _ = fields.push(name, value);
    }
    let _ = fields.push("key", "user/${filename}");
    let _ = fields.push("Content-Type", "image/png");
    let _ = fields.push("x-ignore-note", "fuzz");
    fields.set("bucket", "fuzz-bucket");
    let size = data.len() as u64;

    let encoded = base64(data);
    for candidate in [encoded.as_str(), text.as_ref()] {
        if let Ok(doc) = PolicyDocument::parse(candidate, now) {
            exercise(&doc, now, &fields, size);
        }
    }
    if let Ok(doc) = PolicyDocument::from_json(data, now) {
        exercise(&doc, now, &fields, size);
    }

    if let Ok(cred) = credential(&fields) {
        assert!(
            !verify(&cred, "a secret the input does not know", &encoded),
            "a forged form signature verified: {cred:?}"
        );
    }
    let _ = fields.resolve_key(Some(&text));
    let _ = success_action_status(fields.get("success_action_status"));
    if let Ok(location) = success_redirect(&text, "fuzz-bucket", &text, "\"etag\"") {
        assert!(location.starts_with(text.split('#').next().unwrap_or("")));
        assert!(location.is_ascii() && !location.contains(char::is_whitespace));
    }
});
