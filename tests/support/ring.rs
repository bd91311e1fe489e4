//! The OpenTelemetry Collector's `load_balancing` exporter's ring, ported for the tests that split
//! spans over several instances the way a gateway collector would.
//!
//! Ported from opentelemetry-collector-contrib,
//! `exporter/loadbalancingexporter/consistent_hashing.go` at commit
//! 9d1b9151d5b56ec9555e8672b37868140ae466c0 (routing identifier from `trace_exporter.go` at
//! 035ef9daa4eec2cf0c499641979c46451de74b5f: the 16 raw bytes of the first span's trace id;
//! endpoint order from `resolver_static.go` at 1556b8a4aca764f4be2b798c5ccd7ada3ac8e687, which
//! sorts the endpoints). What is kept exactly:
//! - a position is `crc32_ieee(bytes) % 36000` (`maxPositions`, "360 degrees with two decimal
//!   places");
//! - each endpoint gets `defaultWeight` = 100 points, point `i` at
//!   `crc32_ieee(endpoint bytes ++ [i as u8]) % 36000`;
//! - endpoints are placed in (sorted) list order and a position already taken is skipped (the
//!   earlier endpoint keeps it), then the items are sorted by position;
//! - a lookup finds the first item at or after the identifier's position, wrapping to the first
//!   item (`bsearch`, ported branch for branch below; the Go code indexes an empty left half for a
//!   ring of one item, which 100 points per endpoint never makes, so neither does this port).

#![allow(dead_code)]

/// `maxPositions` upstream.
pub const MAX_POSITIONS: u32 = 36_000;
/// `defaultWeight` upstream: points on the ring per endpoint.
pub const DEFAULT_WEIGHT: usize = 100;

#[derive(Clone, Debug, PartialEq, Eq)]
struct RingItem {
    pos: u32,
    endpoint: usize,
}

/// An immutable ring over a set of endpoints (`hashRing`).
#[derive(Clone, Debug)]
pub struct Ring {
    endpoints: Vec<String>,
    items: Vec<RingItem>,
}

/// CRC-32 with the IEEE polynomial (reflected 0xEDB88320, initial and final XOR 0xFFFFFFFF), as
/// Go's `crc32.NewIEEE` computes it, over the concatenation of `parts`. Bitwise: the tests hash a
/// few hundred thousand short ids, where a table would save nothing that matters.
pub fn crc32_ieee(parts: &[&[u8]]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for p in parts {
        for &b in *p {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
    }
    !crc
}

/// `positionsFor`.
pub fn positions_for(endpoint: &str, num_points: usize) -> Vec<u32> {
    (0..num_points).map(|i| crc32_ieee(&[endpoint.as_bytes(), &[i as u8]]) % MAX_POSITIONS).collect()
}

impl Ring {
    /// `newHashRing` over the endpoints as a static resolver hands them on (sorted).
    pub fn new<S: AsRef<str>>(endpoints: &[S]) -> Ring {
        let mut endpoints: Vec<String> = endpoints.iter().map(|e| e.as_ref().to_string()).collect();
        endpoints.sort();
        // positionsForEndpoints
        let mut taken = std::collections::HashSet::new();
        let mut items = Vec::new();
        for (n, e) in endpoints.iter().enumerate() {
            for pos in positions_for(e, DEFAULT_WEIGHT) {
                if taken.insert(pos) {
                    items.push(RingItem { pos, endpoint: n });
                }
            }
        }
        // sort.Slice is not stable, but positions are unique here, so the order is the same.
        items.sort_by_key(|i| i.pos);
        Ring { endpoints, items }
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// How many points the ring holds (100 per endpoint, less the positions already taken).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// `endpointFor`: the endpoint for a routing identifier (for `traceID`, the trace id's 16
    /// bytes). `None` for an empty ring (upstream: the empty string).
    pub fn endpoint_for(&self, identifier: &[u8]) -> Option<&str> {
        self.index_for(identifier).map(|i| self.endpoints[i].as_str())
    }

    /// The endpoint's index in [`Ring::endpoints`] (sorted order).
    pub fn index_for(&self, identifier: &[u8]) -> Option<usize> {
        let pos = crc32_ieee(&[identifier]) % MAX_POSITIONS;
        self.find(pos)
    }

    /// `findEndpoint`.
    fn find(&self, pos: u32) -> Option<usize> {
        let n = self.items.len();
        if n < 2 {
            // Upstream: "" for 0 items; one item cannot come from 100 points per endpoint.
            return self.items.first().map(|i| i.endpoint);
        }
        let (left, right) = self.items.split_at(n / 2);
        Some(bsearch(pos, left, right).endpoint)
    }

    /// The first point at or after `pos`, wrapping (what `bsearch` computes), by a linear scan:
    /// the tests check the ported search against it.
    pub fn linear_index_for_position(&self, pos: u32) -> Option<usize> {
        self.items.iter().find(|i| i.pos >= pos).or(self.items.first()).map(|i| i.endpoint)
    }

    pub fn index_for_position(&self, pos: u32) -> Option<usize> {
        self.find(pos)
    }
}

/// `bsearch`, branch for branch.
fn bsearch<'a>(pos: u32, left: &'a [RingItem], right: &'a [RingItem]) -> &'a RingItem {
    let (l_last, r_last) = (&left[left.len() - 1], &right[right.len() - 1]);
    if l_last.pos == pos {
        return l_last;
    }
    if right[0].pos == pos {
        return &right[0];
    }
    if pos > r_last.pos {
        return &left[0];
    }
    if pos > l_last.pos {
        let size = right.len();
        if size == 1 {
            return &right[0];
        }
        let (l, r) = right.split_at(size / 2);
        return bsearch(pos, l, r);
    }
    let size = left.len();
    if size == 1 {
        return &left[0];
    }
    let (l, r) = left.split_at(size / 2);
    bsearch(pos, l, r)
}
