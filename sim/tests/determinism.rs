//! The same seed gives the same trace: two runs of a seed hash alike (and seeds differ).
#![forbid(unsafe_code)]

#[test]
fn one_seed_twice_gives_the_same_trace_hash() {
    let mut hashes = Vec::new();
    for seed in [3, 11, 12345] {
        let a = sim::run_seed(seed);
        let b = sim::run_seed(seed);
        assert_eq!(a.violation, None, "seed {seed}");
        assert_eq!(a.hash, b.hash, "seed {seed}: two runs, two traces");
        assert_eq!((a.events, a.faults), (b.events, b.faults), "seed {seed}");
        hashes.push(a.hash);
    }
    hashes.dedup();
    assert_eq!(hashes.len(), 3, "different seeds, different traces");
}

#[test]
fn a_whole_node_seed_twice_gives_the_same_trace_hash() {
    let mut hashes = Vec::new();
    for seed in [3, 8, 12345] {
        let a = sim::whole::run_seed(seed);
        let b = sim::whole::run_seed(seed);
        assert_eq!(a.violation, None, "seed {seed}");
        assert_eq!(a.hash, b.hash, "seed {seed}: two runs, two traces");
        assert_eq!((a.events, a.faults), (b.events, b.faults), "seed {seed}");
        assert!(a.events > 0, "seed {seed} stored nothing");
        hashes.push(a.hash);
    }
    hashes.dedup();
    assert_eq!(hashes.len(), 3, "different seeds, different traces");
}
