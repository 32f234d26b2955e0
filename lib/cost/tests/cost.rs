//! The formulas' exact byte counts, worked by hand.

/// Ring bytes by hand for P = 3, n = 10: chunks ⌊i·10/3⌋ → [0,3) [3,6) [6,10), sizes 3, 3, 4.
/// Rank r sends 2n − |c_{r+1}| − |c_{r+2}| elements: r0 20−3−4, r1 20−4−3, r2 20−3−3.
#[test]
fn ring_bytes_sent_by_hand() {
    let got: Vec<u64> = (0..3)
        .map(|r| gradkit_cost::ring_bytes_sent(3, 10, r))
        .collect();
    assert_eq!(got, [4 * 13, 4 * 13, 4 * 14]);
    assert_eq!(gradkit_cost::ring_bytes_sent(1, 10, 0), 0);
}
