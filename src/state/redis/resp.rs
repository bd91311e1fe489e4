//! Redis's protocol (RESP), written into one buffer.

/// The decimal digits of `v`, in `buf`'s tail; the slice of them.
pub(super) fn digits(v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let (mut v, mut i) = (v, buf.len());
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

fn header(out: &mut Vec<u8>, kind: u8, len: usize) {
    out.push(kind);
    out.extend_from_slice(digits(len as u64, &mut [0; 20]));
    out.extend_from_slice(b"\r\n");
}

/// An array of `len` elements follows.
pub(super) fn array(out: &mut Vec<u8>, len: usize) {
    header(out, b'*', len);
}

/// One bulk string, the concatenation of `parts`.
pub(super) fn bulk(out: &mut Vec<u8>, parts: &[&[u8]]) {
    header(out, b'$', parts.iter().map(|p| p.len()).sum());
    for p in parts {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(b"\r\n");
}

/// `prefix` then `v` in decimal, as one bulk string.
pub(super) fn bulk_number(out: &mut Vec<u8>, prefix: &[u8], v: u64) {
    bulk(out, &[prefix, digits(v, &mut [0; 20])]);
}

/// `v` in decimal then `suffix`, as one bulk string.
pub(super) fn bulk_number_then(out: &mut Vec<u8>, v: u64, suffix: &[u8]) {
    bulk(out, &[digits(v, &mut [0; 20]), suffix]);
}

/// One bulk string whose contents `fill` appends to `out` in place: a record encoded straight
/// into the command, not into a buffer of its own and then copied (that copy alone was 5 % of
/// the store's thread on a flat-out line). Their length is known only once they are
/// written, so the header is laid out for `guess` bytes and the contents moved in the rare case
/// their length has another number of digits. Returns the contents' length; when `fill` fails,
/// `out` holds a partial command and must be dropped.
pub(super) fn bulk_filled<E>(out: &mut Vec<u8>, guess: usize, fill: impl FnOnce(&mut Vec<u8>) -> Result<(), E>) -> Result<usize, E> {
    let at = out.len();
    let guessed = 1 + digits(guess as u64, &mut [0; 20]).len() + 2;
    out.resize(at + guessed, b'$');
    let start = out.len();
    fill(out)?;
    let len = out.len() - start;
    let mut d = [0; 20];
    let d = digits(len as u64, &mut d);
    let header = 1 + d.len() + 2;
    if header > guessed {
        out.resize(out.len() + (header - guessed), 0);
        out.copy_within(start..start + len, at + header);
    } else if header < guessed {
        out.copy_within(start..start + len, at + header);
        out.truncate(at + header + len);
    }
    out[at + 1..at + 1 + d.len()].copy_from_slice(d);
    out[at + 1 + d.len()..at + header].copy_from_slice(b"\r\n");
    out.extend_from_slice(b"\r\n");
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the guess, a filled bulk string is the bulk string of its contents, after
        /// whatever came before it.
        #[test]
        fn a_filled_bulk_string_is_the_bulk_string_of_its_contents(
            before in proptest::collection::vec(any::<u8>(), 0..40),
            contents in proptest::collection::vec(any::<u8>(), 0..2_000),
            guess in prop_oneof![Just(0usize), 0..20_000usize, Just(usize::MAX >> 1)],
        ) {
            let mut want = before.clone();
            bulk(&mut want, &[&contents]);
            let mut got = before.clone();
            let len = bulk_filled(&mut got, guess, |out| {
                out.extend_from_slice(&contents);
                Ok::<(), ()>(())
            });
            prop_assert_eq!(len, Ok(contents.len()));
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_bulk_string_is_its_length_then_its_bytes() {
        let mut out = b"x".to_vec();
        bulk(&mut out, &[b"ab", b"", b"c"]);
        bulk(&mut out, &[]);
        assert_eq!(out, b"x$3\r\nabc\r\n$0\r\n\r\n");
        let mut out = Vec::new();
        assert_eq!(bulk_filled(&mut out, 5, |_| Err::<(), _>("no")), Err("no"));
    }
}
