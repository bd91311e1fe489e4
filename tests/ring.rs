//! The test router's ring (tests/support/ring.rs, a port of the collector's load_balancing
//! exporter ring): the ported search is the "first point at or after, wrapping" it claims to be,
//! trace ids spread over the endpoints, endpoint order does not matter, and a ring change moves
//! only the share a new endpoint takes (3 → 4 endpoints: about a quarter, all to the new one).

#[path = "support/ring.rs"]
mod ring;

use ring::{crc32_ieee, positions_for, Ring, DEFAULT_WEIGHT, MAX_POSITIONS};

/// Trace ids as an SDK makes them (random 16 bytes), from a fixed seed so the figures repeat.
fn trace_ids(n: usize) -> Vec<[u8; 16]> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            let mut t = [0u8; 16];
            for half in t.chunks_mut(8) {
                // splitmix64
                x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                half.copy_from_slice(&(z ^ (z >> 31)).to_be_bytes());
            }
            t
        })
        .collect()
}

fn endpoints(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("mcp-health-{i}.mcp-health.obs.svc.cluster.local:4317")).collect()
}

#[test]
fn crc32_is_ieee_and_positions_are_100_per_endpoint_below_36000() {
    // The IEEE polynomial's check value (what Go's crc32.ChecksumIEEE gives for "123456789").
    assert_eq!(crc32_ieee(&[b"123456789"]), 0xCBF4_3926);
    assert_eq!(crc32_ieee(&[b"1234", b"56789"]), 0xCBF4_3926, "parts are hashed as one");
    assert_eq!(crc32_ieee(&[b"The quick brown fox jumps over the lazy dog"]), 0x414F_A339);
    let p = positions_for("10.0.0.1:4317", DEFAULT_WEIGHT);
    assert_eq!(p.len(), 100);
    assert!(p.iter().all(|x| *x < MAX_POSITIONS));
    // Point i hashes the endpoint followed by the byte i.
    assert_eq!(p[7], crc32_ieee(&[b"10.0.0.1:4317\x07"]) % 36_000);
    let r = Ring::new(&endpoints(3));
    assert!(r.len() <= 300 && r.len() > 290, "{} points (collisions are skipped)", r.len());
}

#[test]
fn the_ported_search_is_first_point_at_or_after_wrapping() {
    for n in 1..=5 {
        let r = Ring::new(&endpoints(n));
        for pos in 0..MAX_POSITIONS {
            assert_eq!(r.index_for_position(pos), r.linear_index_for_position(pos), "{n} endpoints, position {pos}");
        }
    }
    assert_eq!(Ring::new::<&str>(&[]).endpoint_for(&[1; 16]), None);
}

#[test]
fn endpoint_order_does_not_matter_and_ids_spread() {
    let mut e = endpoints(3);
    let a = Ring::new(&e);
    e.reverse();
    let b = Ring::new(&e);
    let ids = trace_ids(30_000);
    let mut counts = [0usize; 3];
    for t in &ids {
        assert_eq!(a.endpoint_for(t), b.endpoint_for(t));
        counts[a.index_for(t).unwrap()] += 1;
    }
    println!("30000 trace ids over 3 endpoints: {counts:?}");
    assert!(counts.iter().all(|c| *c > 6_000 && *c < 14_000), "{counts:?}");
}

#[test]
fn three_to_four_endpoints_moves_about_a_quarter_all_to_the_new_one() {
    let (three, four) = (Ring::new(&endpoints(3)), Ring::new(&endpoints(4)));
    let new_one = endpoints(4)[3].clone();
    let ids = trace_ids(100_000);
    let mut moved = 0;
    for t in &ids {
        let (before, after) = (three.endpoint_for(t).unwrap(), four.endpoint_for(t).unwrap());
        if before != after {
            moved += 1;
            assert_eq!(after, new_one, "a moved id goes to the endpoint that was added");
        }
    }
    let share = moved as f64 / ids.len() as f64;
    println!("3 -> 4 endpoints: {moved} of {} trace ids moved ({:.1} %)", ids.len(), share * 100.0);
    assert!((0.15..0.35).contains(&share), "{share}");
    // Removing one of four moves exactly that endpoint's ids.
    let gone = endpoints(4)[1].clone();
    let mut rest = endpoints(4);
    rest.remove(1);
    let after = Ring::new(&rest);
    for t in &ids {
        let was = four.endpoint_for(t).unwrap();
        if was != gone {
            assert_eq!(after.endpoint_for(t).unwrap(), was);
        }
    }
}
