//! The CSA path of one decode step end to end on the CPU backend
//! (tests/common/csa_pipeline.rs: indexer key and query preparation, scores +
//! top-k, decode streams and the CSA tail, apart and fused, sparse decode, against float64).
//! Inputs are fresh and random each run; the seed is printed, rerun a failure
//! with `UNIKV_TEST_SEED=<seed>`.

mod common;

use common::*;

#[test]
fn indexer_topk_feeds_csa_decode() {
    let (mut rng, _) = seeded("indexer_topk_feeds_csa_decode");
    for fused in [false, true] {
        common::csa_pipeline::run(&Ctx::cpu(2), &mut rng, 0.0, fused);
    }
}
