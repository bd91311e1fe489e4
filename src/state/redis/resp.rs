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
