//! Receipt provenance: outcome evidence the checked server cannot forge.
//!
//! The outcome layer exists because the server under test may lie, so it must not be able to
//! verify itself. It can reach the receivers (it may share the pipeline) and it knows the call's
//! trace id (`_meta.traceparent`) and request id: an unauthenticated `mcp_health.outcome.*` span
//! is something it can write. A receipt is therefore *signed* by whoever checked the
//! destination — the tap's verifiers, or the agent's own code — with an Ed25519 key the operator
//! gave it, over the call it checked (trace id, call span id, request id, tool), the rule, the
//! finding, the method and the time. The service is told which public keys it trusts.
//!
//! Why a signature and not the alternatives: a signature survives collectors and load balancers
//! in between (a client certificate or a bearer token proves only the last hop, and a collector
//! re-sends everything under its own identity); an HMAC would put a key that can *make* receipts
//! into every service instance; a dedicated receipt listener needs its own network path and still
//! cannot tell a verifier from the server sharing its host. With a signature only the holder of
//! the private key can vouch for a finding, and a copied receipt is bound to the call it names.
//!
//! Policy: with no trusted key configured, receipts are taken as they come (`unsigned`) — the
//! behaviour of a pipeline that trusts every sender, and what the embedded default and `replay` of
//! the fixtures do — and every verdict says so (`outcome_trust`). With trusted keys, only a
//! receipt with a valid signature by one of them (`signed`) can pass or fail the outcome layer;
//! anything else is `untrusted`: recorded, never evidence.

use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use sha2::{Digest, Sha256};

/// How keys are written: `ed25519:<hex>` (the public key, 32 bytes; or, in a signing-key file,
/// the 32-byte seed).
pub const KEY_PREFIX: &str = "ed25519:";

/// Why a key could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("a key is `ed25519:` followed by 64 hex digits")]
    Malformed,
    #[error("the key was rejected: {0}")]
    Rejected(String),
}

/// The trust a receipt had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptTrust {
    /// No trusted key is configured: taken as it came (any sender could have written it).
    #[default]
    Unsigned,
    /// Signed by a key the operator trusts, over the call it names.
    Signed,
    /// Trusted keys are configured and this receipt has no valid signature by one of them.
    /// Recorded, never evidence.
    Untrusted,
}

impl ReceiptTrust {
    pub fn as_str(self) -> &'static str {
        match self {
            ReceiptTrust::Unsigned => "unsigned",
            ReceiptTrust::Signed => "signed",
            ReceiptTrust::Untrusted => "untrusted",
        }
    }
}

/// What a receipt signature covers. One line per field, fixed order, versioned: the same bytes
/// on the signing and the verifying side, whatever JSON or attribute encoding carried them.
#[allow(clippy::too_many_arguments)]
pub fn message(
    trace_id: &[u8; 16],
    call_span_id: &[u8; 8],
    request_id: &str,
    tool: &str,
    verifier: &str,
    result: &str,
    method: &str,
    checked_at_ns: u64,
) -> Vec<u8> {
    format!(
        "mcp-health-receipt-v1\n{}\n{}\n{request_id}\n{tool}\n{verifier}\n{result}\n{method}\n{checked_at_ns}\n",
        hex::encode(trace_id),
        hex::encode(call_span_id)
    )
    .into_bytes()
}

/// A key's short id: the first 16 hex digits of the SHA-256 of the public key.
pub fn key_id(public: &[u8]) -> String {
    hex::encode(Sha256::digest(public))[..16].to_string()
}

fn key_bytes(s: &str) -> Result<[u8; 32], KeyError> {
    let hexpart = s.trim().strip_prefix(KEY_PREFIX).ok_or(KeyError::Malformed)?;
    hex::decode(hexpart).ok().and_then(|b| b.try_into().ok()).ok_or(KeyError::Malformed)
}

/// A signing key (the tap's, or an agent's).
pub struct SigningKey {
    pair: Ed25519KeyPair,
    id: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey").field("id", &self.id).finish_non_exhaustive()
    }
}

impl SigningKey {
    /// From a signing-key file's text: `ed25519:<hex of the 32-byte seed>`.
    pub fn parse(s: &str) -> Result<SigningKey, KeyError> {
        let seed = key_bytes(s)?;
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed).map_err(|e| KeyError::Rejected(e.to_string()))?;
        let id = key_id(pair.public_key().as_ref());
        Ok(SigningKey { pair, id })
    }

    /// A new key: the signing-key file's text and the key.
    pub fn generate() -> Result<(String, SigningKey), KeyError> {
        let mut seed = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed).map_err(|e| KeyError::Rejected(e.to_string()))?;
        let text = format!("{KEY_PREFIX}{}", hex::encode(seed));
        let key = SigningKey::parse(&text)?;
        Ok((text, key))
    }

    /// The public key, as the service's `trusted_keys` list takes it.
    pub fn public(&self) -> String {
        format!("{KEY_PREFIX}{}", hex::encode(self.pair.public_key().as_ref()))
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The signature of `msg`, hex.
    pub fn sign(&self, msg: &[u8]) -> String {
        hex::encode(self.pair.sign(msg).as_ref())
    }
}

/// The public keys a service trusts, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedKeys {
    keys: Vec<(String, [u8; 32])>,
}

impl TrustedKeys {
    pub fn parse<S: AsRef<str>>(list: &[S]) -> Result<TrustedKeys, KeyError> {
        let mut keys = Vec::with_capacity(list.len());
        for k in list {
            let b = key_bytes(k.as_ref())?;
            keys.push((key_id(&b), b));
        }
        Ok(TrustedKeys { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether `signature` (hex) over `msg` is by the trusted key `key_id`.
    pub fn verify(&self, key_id: &str, msg: &[u8], signature: &str) -> bool {
        let Some((_, public)) = self.keys.iter().find(|(id, _)| id == key_id) else { return false };
        let Ok(sig) = hex::decode(signature) else { return false };
        UnparsedPublicKey::new(&ED25519, public).verify(msg, &sig).is_ok()
    }

    /// The trust of a receipt under these keys: `unsigned` when there are none, else `signed`
    /// only for a valid signature by one of them.
    pub fn judge(&self, signed_by: Option<(&str, &str)>, msg: impl FnOnce() -> Vec<u8>) -> ReceiptTrust {
        if self.is_empty() {
            return ReceiptTrust::Unsigned;
        }
        match signed_by {
            Some((id, sig)) if self.verify(id, &msg(), sig) => ReceiptTrust::Signed,
            _ => ReceiptTrust::Untrusted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_binds_the_receipt_to_its_call_and_finding() {
        let (text, key) = SigningKey::generate().unwrap();
        assert_eq!(SigningKey::parse(&text).unwrap().public(), key.public());
        let trusted = TrustedKeys::parse(&[key.public()]).unwrap();
        let msg = |trace: u8, result: &str| message(&[trace; 16], &[2; 8], "7", "transfer_funds", "paid", result, "http_status", 99);
        let sig = key.sign(&msg(1, "confirmed"));
        assert_eq!(trusted.judge(Some((key.id(), &sig)), || msg(1, "confirmed")), ReceiptTrust::Signed);
        // The same signature on another call, or on another finding: not this receipt's.
        assert_eq!(trusted.judge(Some((key.id(), &sig)), || msg(3, "confirmed")), ReceiptTrust::Untrusted);
        assert_eq!(trusted.judge(Some((key.id(), &sig)), || msg(1, "missing")), ReceiptTrust::Untrusted);
        // Unsigned, or signed by a key nobody trusts.
        assert_eq!(trusted.judge(None, || msg(1, "confirmed")), ReceiptTrust::Untrusted);
        let (_, other) = SigningKey::generate().unwrap();
        let forged = other.sign(&msg(1, "confirmed"));
        assert_eq!(trusted.judge(Some((other.id(), &forged)), || msg(1, "confirmed")), ReceiptTrust::Untrusted);
        assert_eq!(trusted.judge(Some((key.id(), &forged)), || msg(1, "confirmed")), ReceiptTrust::Untrusted);
        assert_eq!(trusted.judge(Some((key.id(), "zz")), || msg(1, "confirmed")), ReceiptTrust::Untrusted);
        // No keys configured: taken as it came.
        assert_eq!(TrustedKeys::default().judge(None, || msg(1, "confirmed")), ReceiptTrust::Unsigned);
        // Malformed keys are refused by name.
        assert_eq!(TrustedKeys::parse(&["ed25519:abc"]), Err(KeyError::Malformed));
        assert_eq!(TrustedKeys::parse(&["rsa:00"]), Err(KeyError::Malformed));
    }
}
