//! How a record is framed in the store: its format version before its bytes.
//!
//! A record written by this build is [`MAGIC`], its format version as a varint, then the record
//! (postcard). 0.1.0 wrote the bare record, with no frame: that is format version 0, whose
//! layouts `super::v0` keeps so that an upgrade reads what the previous release wrote. A record
//! framed with a version this build does not know (written by a newer build: a downgrade, or a
//! newer instance on a shared store) is refused by name, never read as something it is not.
//!
//! The magic is four bytes a bare 0.1.0 record starts with only by chance (most start with a
//! random trace id, a small count or a short string's length): about once in 2^32 records. Such
//! a record that does not decode in the framed form is read as version 0 after all; one that
//! also names a version above [`CURRENT`] is refused, never misread.

/// What a framed record starts with.
pub const MAGIC: [u8; 4] = [0xff, b'm', b'h', b's'];

/// The format version this build writes. 1: the first framed one (adds, to 0.1.0's layouts,
/// what the records gained since; see `super::v0`).
pub(crate) const CURRENT: u32 = 1;

/// The state protocol this build speaks: what instances sharing a store announce, the lowest of
/// which the cluster follows. 0: release 0.1.0 (bare records); 1: release 0.2.0 (records framed
/// in format 1); 2: this build — records as in 1, and on Redis each record is one string, its
/// version then its bytes, where 1 wrote a hash of two fields (see `super::redis`).
pub(crate) const PROTOCOL: u32 = 2;

/// The protocol from which a record on Redis is one string rather than a hash.
pub(crate) const STRING_RECORDS_SINCE: u32 = 2;

/// The record format a cluster speaking `protocol` reads.
pub(crate) fn format_of(protocol: u32) -> u32 {
    protocol.min(CURRENT)
}

/// A stored record's bytes, by their frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framed<'a> {
    /// No frame: 0.1.0's layout (format version 0).
    Bare(&'a [u8]),
    /// A frame with this version and payload.
    Version(u32, &'a [u8]),
}

/// Read a record's frame.
pub(crate) fn framed(bytes: &[u8]) -> Framed<'_> {
    let Some(rest) = bytes.strip_prefix(&MAGIC[..]) else { return Framed::Bare(bytes) };
    // The version: an unsigned LEB128 varint, at most five bytes for a u32.
    let mut v: u64 = 0;
    for (i, b) in rest.iter().take(5).enumerate() {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return match u32::try_from(v) {
                Ok(v) => Framed::Version(v, &rest[i + 1..]),
                Err(_) => Framed::Bare(bytes),
            };
        }
    }
    Framed::Bare(bytes)
}

/// Frame a record's payload with the current version.
pub(crate) fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAGIC.len() + 1 + payload.len());
    frame_into(&mut out);
    out.extend_from_slice(payload);
    out
}

/// The current version's frame appended to `out` (its payload follows).
pub(crate) fn frame_into(out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    let mut v = CURRENT;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            break;
        }
        out.push(b | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_reads_back_and_bare_bytes_are_version_zero() {
        let f = frame(b"payload");
        assert_eq!(framed(&f), Framed::Version(CURRENT, b"payload"));
        assert_eq!(framed(b"\x01\x02payload"), Framed::Bare(b"\x01\x02payload"));
        assert_eq!(framed(b""), Framed::Bare(b""));
        // A version past what this build knows reads as that version (the caller refuses it).
        let mut newer = MAGIC.to_vec();
        newer.extend([0x80, 0x01]); // 128
        newer.extend(b"x");
        assert_eq!(framed(&newer), Framed::Version(128, b"x"));
        // The magic alone, or a runaway varint, is no frame.
        assert_eq!(framed(&MAGIC), Framed::Bare(&MAGIC));
        let mut runaway = MAGIC.to_vec();
        runaway.extend([0xff; 6]);
        assert_eq!(framed(&runaway), Framed::Bare(&runaway));
    }
}
