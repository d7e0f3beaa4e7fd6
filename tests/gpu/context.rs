//! Backend selection: `auto` picks the GPU when there is one.

use super::*;

#[test]
fn auto_context_falls_back_to_cpu() {
    let auto = context(0).expect("auto context");
    match context(2) {
        Ok(_) => assert_eq!(
            backend_of(&auto),
            2,
            "auto must pick the GPU when one is present"
        ),
        Err(status) => {
            assert_eq!(status, UNIKV_BACKEND_UNAVAILABLE);
            assert!(last_error().contains("backend"), "{}", last_error());
            assert_eq!(
                backend_of(&auto),
                1,
                "auto without a GPU is the CPU backend"
            );
        }
    }
}
