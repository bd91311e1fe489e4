//! Receive: OTLP/gRPC and OTLP/HTTP in, admitted evidence batches out.

pub(crate) mod admit;
pub(crate) mod certificates;
pub(crate) mod config;
pub(crate) mod listen;
pub(crate) mod otlp_grpc;
pub(crate) mod otlp_http;
pub(crate) mod otlp_json;
pub(crate) mod throttle;
pub(crate) mod tls;

/// Whether `authorization` carries `token` as a bearer token (`receivers.otlp.auth`), compared in
/// constant time. Both receivers ask it; the token itself is configuration, the check is theirs.
pub(crate) fn bearer_matches(authorization: Option<&[u8]>, token: &str) -> bool {
    let Some(v) = authorization else { return false };
    let Some(got) = v.strip_prefix(b"Bearer ").or_else(|| v.strip_prefix(b"bearer ")) else { return false };
    let want = token.as_bytes();
    got.len() == want.len() && got.iter().zip(want).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::bearer_matches;

    #[test]
    fn a_bearer_token_matches_only_itself() {
        let table: [(Option<&[u8]>, bool); 8] = [
            (Some(b"Bearer s3cret-token"), true),
            (Some(b"bearer s3cret-token"), true),
            (Some(b"Bearer s3cret-tokeN"), false),
            (Some(b"Bearer s3cret-token "), false),
            (Some(b"Bearer s3cret"), false),
            (Some(b"Basic s3cret-token"), false),
            (Some(b"s3cret-token"), false),
            (None, false),
        ];
        for (header, want) in table {
            assert_eq!(bearer_matches(header, "s3cret-token"), want, "{:?}", header.map(String::from_utf8_lossy));
        }
    }
}
