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
pub use crate::evidence::hash::{hash_hex, session_hash, set_session_cache_capacity, to_hex};

/// Heuristic for values that are credentials whatever key they came under: bearer prefixes, JWTs,
/// long high-entropy tokens.
pub fn looks_like_secret(s: &str) -> bool {
    let lower = s.to_ascii_lowercase();
    if lower.starts_with("bearer ") || lower.starts_with("basic ") || lower.contains("token=") {
        return true;
    }
    // A JWT: three base64url segments, the first starting with `eyJ`.
    if s.starts_with("eyJ") && s.matches('.').count() == 2 {
        return true;
    }
    // A long run without separators that mixes digits and letters reads as a key.
    s.len() >= 32
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && s.bytes().any(|b| b.is_ascii_digit())
        && s.bytes().any(|b| b.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn identifiers_pass_but_tokens_are_hashed() {
        assert_eq!(&*ident("create_ticket"), "create_ticket");
        assert!(ident("Bearer abc.def").starts_with("sha256:"));
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
    fn scope_keeps_only_scope_tokens() {
        assert_eq!(scope("tickets:write repo").as_deref(), Some("tickets:write repo"));
        assert_eq!(scope("a\"b").as_deref(), None);
        assert_eq!(scope("ok Bearer").as_deref(), Some("ok Bearer"));
        assert_eq!(scope("").as_deref(), None);
    }
}
