//! Gives the shared library its SONAME. The header is never written here: the
//! `header` test regenerates it into a temporary folder and compares.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libunikv.so.{major}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
