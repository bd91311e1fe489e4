//! What must never leave: the few strings mcp-health keeps from the wire are bounded, reduced to a
//! safe alphabet, or hashed. Free text (messages, arguments, results, headers, bodies) is never
//! read into the evidence model at all; these helpers guard the identifiers that are.

/// Longest identifier kept verbatim (tool names, request ids, server addresses).
pub const MAX_IDENT: usize = 128;

/// Keep an identifier if it is short and printable; otherwise replace it by a hash, so joins still
/// work but an oversize or binary value (possibly a pasted secret) is not reproduced.
pub fn ident(s: &str) -> Box<str> {
    if s.len() <= MAX_IDENT && s.chars().all(|c| !c.is_control()) && !looks_like_secret(s) {
        s.into()
    } else {
        format!("sha256:{}", &hash_hex(s.as_bytes())[..16]).into_boxed_str()
    }
}

/// An OAuth scope list: RFC 6749 scope tokens only (`%x21 / %x23-5B / %x5D-7E`), space separated.
/// Anything else in a challenge is dropped.
pub fn scope(s: &str) -> Option<Box<str>> {
    let kept: Vec<&str> = s
        .split(' ')
        .filter(|t| {
            !t.is_empty() && t.len() <= 64 && t.bytes().all(|b| b == 0x21 || (0x23..=0x5B).contains(&b) || (0x5D..=0x7E).contains(&b))
        })
        .filter(|t| !looks_like_secret(t))
        .take(16)
        .collect();
    (!kept.is_empty()).then(|| kept.join(" ").into_boxed_str())
}

// The hashes of identifiers live with the evidence model (the classifier needs them and must not
// depend on the normalizers); re-exported here for the readers and emitters that use them.
pub use crate::evidence::hash::{fit_session_cache, hash_hex, session_hash};

/// A method name from the specification's list, else `other` (`notifications/other` for an
/// unknown notification, so it stays one): the evidence model's vocabulary, so a label and a
/// span's method never disagree.
pub fn method(s: &str) -> &'static str {
    crate::evidence::MethodName::of(s).as_str()
}

/// A tool name as the specification's rule allows it (1–128 of `A-Z a-z 0-9 _ - .`, 2025-11-25)
/// and not credential-shaped; anything else is hashed (joins still work, the text is not kept).
pub fn tool_name(s: &str) -> Box<str> {
    let ok = (1..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) && !looks_like_secret(s);
    if ok {
        s.into()
    } else {
        hashed(s)
    }
}

/// A server address without userinfo (`user:secret@`), scheme or path, then as [`ident`].
pub fn address(s: &str) -> Box<str> {
    let s = s.split_once("://").map_or(s, |(_, rest)| rest);
    let s = s.rsplit_once('@').map_or(s, |(_, host)| host);
    let s = s.split(['/', '?', '#']).next().unwrap_or("");
    ident(s)
}

/// A cursor of a paginated list: opaque server text (it may embed anything), kept only as a hash
/// so pages still chain. Idempotent: a cursor the tap already hashed passes unchanged.
pub fn cursor(s: &str) -> Box<str> {
    let is_hash = s.len() == 23 && s.starts_with("sha256:") && s[7..].bytes().all(|b| b.is_ascii_hexdigit());
    if is_hash {
        s.into()
    } else {
        hashed(s)
    }
}

fn hashed(s: &str) -> Box<str> {
    format!("sha256:{}", &hash_hex(s.as_bytes())[..16]).into_boxed_str()
}

/// Heuristic for values that are credentials whatever key they came under: bearer prefixes, JWTs,
/// long high-entropy tokens.
pub fn looks_like_secret(s: &str) -> bool {
    // Case-insensitive, without a lowered copy (this runs on every request id).
    let b = s.as_bytes();
    let starts = |p: &[u8]| b.len() >= p.len() && b[..p.len()].eq_ignore_ascii_case(p);
    if starts(b"bearer ") || starts(b"basic ") || assigns_a_secret(b) {
        return true;
    }
    // Providers' key formats, by their prefixes (case as the providers write them).
    const PREFIXES: &[&str] =
        &["ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_", "glpat-", "sk_live_", "sk_test_", "rk_live_", "rk_test_", "xapp-", "AIza"];
    if PREFIXES.iter().any(|p| s.len() > p.len() + 8 && s.starts_with(p)) {
        return true;
    }
    // Slack tokens (`xoxb-`, `xoxp-`, `xoxa-`, …) and AWS access key ids (`AKIA`/`ASIA` + 16).
    if s.len() >= 10 && s.starts_with("xox") && b[4] == b'-' && b[3].is_ascii_alphabetic() {
        return true;
    }
    if s.len() == 20
        && (s.starts_with("AKIA") || s.starts_with("ASIA"))
        && b[4..].iter().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
    {
        return true;
    }
    // A JWT: three base64url segments, the first starting with `eyJ`.
    if s.starts_with("eyJ") && s.matches('.').count() == 2 {
        return true;
    }
    // A long run without separators that mixes digits and letters reads as a key; base64 (with
    // `+`, `/`, `=` padding) and base64url alike.
    let b64 = |b: u8| b.is_ascii_alphanumeric() || b"_-+/=".contains(&b);
    let mixed = s.bytes().any(|b| b.is_ascii_digit()) && s.bytes().any(|b| b.is_ascii_alphabetic());
    if s.len() >= 32 && s.bytes().all(b64) && mixed {
        return true;
    }
    // Shorter base64 with its tell-tale characters: `+` or `/` inside and `=` padding.
    if s.len() >= 16 && s.bytes().all(b64) && mixed && s.ends_with('=') && s.bytes().any(|b| b == b'+' || b == b'/') {
        return true;
    }
    // Length plus entropy: 20 or more key characters, letters and digits mixed, no word breaks,
    // and close to random (at least 4 bits of Shannon entropy per character).
    s.len() >= 20 && s.bytes().all(|b| b.is_ascii_alphanumeric()) && mixed && entropy_bits(b) >= 4.0
}

/// `key=`, `secret=`, `pass…=`, `api_key=`, `apikey=`, `api-key=`, `token=` anywhere, any case.
fn assigns_a_secret(b: &[u8]) -> bool {
    const WORDS: &[&[u8]] = &[b"token", b"key", b"secret", b"password", b"passwd", b"pass", b"pwd"];
    b.iter().enumerate().filter(|(_, c)| **c == b'=').any(|(i, _)| {
        let before = &b[..i];
        // The name before `=`: the run of letters, digits, `_` and `-` that ends there.
        let start = before.iter().rposition(|c| !(c.is_ascii_alphanumeric() || *c == b'_' || *c == b'-')).map_or(0, |p| p + 1);
        let name = &before[start..];
        WORDS.iter().any(|w| name.len() >= w.len() && name[name.len() - w.len()..].eq_ignore_ascii_case(w))
            || (name.len() >= 4 && name[..4].eq_ignore_ascii_case(b"pass"))
    })
}

/// Shannon entropy of the bytes, in bits per byte.
fn entropy_bits(b: &[u8]) -> f64 {
    let mut counts = [0u32; 256];
    for c in b {
        counts[*c as usize] += 1;
    }
    let n = b.len() as f64;
    counts.iter().filter(|c| **c > 0).map(|c| f64::from(*c) / n).map(|p| -p * p.log2()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::hash::to_hex;
    use sha2::{Digest, Sha256};

    #[test]
    fn identifiers_pass_but_tokens_are_hashed() {
        assert_eq!(&*ident("create_ticket"), "create_ticket");
        assert!(ident("Bearer abc.def").starts_with("sha256:"));
        // The credential prefixes and `token=` in any case, anywhere for the latter.
        for secret in ["BEARER x", "bAsIc x", "a?TOKEN=x", "token=", "Token=1"] {
            assert!(looks_like_secret(secret), "{secret}");
        }
        for plain in ["bearer", "basic", "tokens", "my-token", "7"] {
            assert!(!looks_like_secret(plain), "{plain}");
        }
        assert_eq!(
            crate::normalize::value::id_with(
                &Some(crate::normalize::view::AnyValue { value: Some(crate::normalize::view::Value::IntValue(i64::MIN)) }),
                ident
            )
            .as_deref(),
            Some("-9223372036854775808")
        );
        assert!(ident("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig").starts_with("sha256:"));
        assert!(ident(&"x".repeat(200)).starts_with("sha256:"));
        assert!(ident("sk_live_4eC39HqLyjWDarjtT1zdp7dc9aZ").starts_with("sha256:"));
    }

    #[test]
    fn hex_and_session_hash_agree_with_the_reference() {
        assert_eq!(to_hex(&[0x00, 0xab, 0xff]), "00abff");
        assert_eq!(hash_hex(b"abc"), hex::encode(Sha256::digest(b"abc")));
        assert_eq!(&*session_hash("s-1"), hash_hex(b"session:s-1"));
        assert_eq!(&*session_hash("s-1"), hash_hex(b"session:s-1"), "cached answer is the same");
    }

    #[test]
    fn vocabularies_keep_what_the_specification_names_and_hash_the_rest() {
        assert_eq!(method("tools/call"), "tools/call");
        assert_eq!(method("tools/call?token=abc"), "other");
        assert_eq!(method("notifications/x-secret"), "notifications/other");
        assert_eq!(&*tool_name("create_ticket"), "create_ticket");
        assert!(tool_name("create ticket").starts_with("sha256:"));
        assert!(tool_name("a/b").starts_with("sha256:"));
        assert!(tool_name(&"t".repeat(129)).starts_with("sha256:"));
        assert_eq!(&*address("user:s3cret@tickets.example:443"), "tickets.example:443");
        assert_eq!(&*address("https://tok@api.example/mcp?key=1"), "api.example");
        assert!(cursor("eyJwYWdlIjoyfQ==").starts_with("sha256:"));
        assert_eq!(cursor(&cursor("c1")), cursor("c1"), "idempotent: the tap's hash passes the receiver");
    }

    /// Issue 22: the secrets a redaction review found passing, hashed now; and identifiers that
    /// must stay readable.
    #[test]
    fn provider_keys_and_assignments_are_credentials() {
        for k in [
            "AKIAIOSFODNN7EXAMPLE",
            "ASIAIOSFODNN7EXAMPLE",
            "xoxb-1234-5678-abcd",
            "xoxp-12-34",
            "ghp_abcdefghijklmnop123456",
            "glpat-abcdefghij123",
            "sk_live_abcdefgh1234",
            "AIzaSyA1234567890abcdefgh",
            "api_key=abc",
            "req?apiKey=1",
            "x-api-key=2",
            "secret=s",
            "password=p",
            "db_pass=p",
            "passphrase=p",
            "q8Zr2LmX7vKp4Nw9Tb3Y",
        ] {
            assert!(looks_like_secret(k), "{k}");
            assert!(ident(k).starts_with("sha256:"), "{k}");
        }
        for ok in ["create_ticket", "AKIA", "transfer_funds", "req-17", "tools/call", "2026-07-28", "monkey", "keyboard=x1"] {
            assert!(!looks_like_secret(ok), "{ok}");
        }
    }

    #[test]
    fn base64_keys_are_credentials() {
        for k in ["AbC123dEf456gHi789/Key+Xyz0==", "dGhpcyBpcyBhIHNlY3JldCBrZXkgMTIzNDU2Nzg5MA==", "Zm9vYmFyMTIz+/ab=="] {
            assert!(looks_like_secret(k), "{k}");
            assert!(ident(k).starts_with("sha256:"), "{k}");
            assert_eq!(scope(&format!("tickets:write {k}")).as_deref(), Some("tickets:write"), "{k}");
        }
        for ok in ["tickets:write", "create_ticket", "2025-11-25", "repo"] {
            assert!(!looks_like_secret(ok), "{ok}");
        }
    }

    #[test]
    fn scope_keeps_only_scope_tokens() {
        assert_eq!(scope("tickets:write repo").as_deref(), Some("tickets:write repo"));
        assert_eq!(scope("a\"b").as_deref(), None);
        assert_eq!(scope("ok Bearer").as_deref(), Some("ok Bearer"));
        assert_eq!(scope("").as_deref(), None);
    }
}
