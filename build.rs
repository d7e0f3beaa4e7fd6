//! Gives the shared library its SONAME and, with the `cuda` feature, compiles
//! `kernels/` with nvcc through the `cc` crate. The header is never written
//! here: the `header` test regenerates it into a temporary folder and compares.

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libunikv.so.{major}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "cuda")]
    cuda::build();
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::env;
    use std::path::PathBuf;

    const SOURCES: &[&str] = &[
        "shim.cu",
        "store.cu",
        "cache_store.cu",
        "prepare.cu",
        "index.cu",
        "rope.cu",
        "attention.cu",
        "devtools.cu",
        "fp8_check.cu",
    ];
    const HEADERS: &[&str] = &[
        "compat.cuh",
        "shim.cuh",
        "params.h",
        "fp8.cuh",
        "pool_rows.cuh",
    ];
    const DEFAULT_ARCHS: &str = "sm_90a;sm_80";

    /// nvcc from CUDA_HOME/bin or PATH; the `cc` crate must see it by its bare
    /// name on PATH (an absolute path makes it pass gcc flags to nvcc).
    fn find_nvcc() -> PathBuf {
        let from_home = env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("bin"));
        let path = env::var_os("PATH").unwrap_or_default();
        let mut dirs: Vec<PathBuf> = from_home.into_iter().collect();
        dirs.extend(env::split_paths(&path));
        let Some(bin) = dirs.iter().find(|d| d.join("nvcc").is_file()).cloned() else {
            panic!(
                "the `cuda` feature needs nvcc 13.0 (CUDA toolkit): set CUDA_HOME or put nvcc on \
                 PATH; scripts/install-nvcc.sh installs it from the Python package index \
                 (eval \"$(scripts/install-nvcc.sh --env)\")"
            );
        };
        dirs.retain(|d| *d != bin);
        dirs.insert(0, bin.clone());
        env::set_var("PATH", env::join_paths(dirs).expect("PATH"));
        bin.parent().expect("CUDA home").to_path_buf()
    }

    /// `UNIKV_CUDA_ARCHS`, e.g. "sm_90a;sm_80": each becomes a -gencode pair.
    fn gencode_flags() -> Vec<String> {
        let archs = env::var("UNIKV_CUDA_ARCHS").unwrap_or_else(|_| DEFAULT_ARCHS.into());
        let list: Vec<&str> = archs
            .split([';', ','])
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect();
        if list.is_empty() {
            panic!("UNIKV_CUDA_ARCHS is empty: name at least one target, e.g. sm_90a");
        }
        list.iter()
            .map(|arch| {
                let Some(num) = arch.strip_prefix("sm_") else {
                    panic!("UNIKV_CUDA_ARCHS: {arch:?} is not of the form sm_NN[a]");
                };
                format!("-gencode=arch=compute_{num},code=sm_{num}")
            })
            .collect()
    }

    pub fn build() {
        println!("cargo:rerun-if-env-changed=UNIKV_CUDA_ARCHS");
        println!("cargo:rerun-if-env-changed=CUDA_HOME");
        let home = find_nvcc();
        for header in HEADERS {
            println!("cargo:rerun-if-changed=kernels/{header}");
        }
        // One nvcc run per source, each a whole program: with several files in
        // one cc::Build, cc compiles relocatable device code (--device-c), and
        // ptxas then serializes the wgmma instructions of the attention kernel
        // (C7509). No device code crosses files, so nothing needs a device link.
        let builds: Vec<_> = SOURCES
            .iter()
            .map(|src| {
                println!("cargo:rerun-if-changed=kernels/{src}");
                let mut build = cc::Build::new();
                // No debug build of device code: cc would pass -G, which turns
                // off optimization and serializes every wgmma (ptxas C7520).
                build
                    .debug(false)
                    .cuda(true)
                    .cudart("static")
                    .flag("-std=c++17")
                    .flag("-Xcompiler=-fPIC")
                    .flag("-Xcompiler=-Wall,-Wextra")
                    .flag("-Werror=all-warnings")
                    .include("kernels")
                    .file(format!("kernels/{src}"));
                for flag in gencode_flags() {
                    build.flag(&flag);
                }
                let name = format!("unikv_kernels_{}", src.trim_end_matches(".cu"));
                std::thread::spawn(move || build.compile(&name))
            })
            .collect();
        for build in builds {
            build.join().expect("nvcc build thread");
        }
        for lib in ["lib", "lib64", "targets/x86_64-linux/lib"] {
            let dir = home.join(lib);
            if dir.is_dir() {
                println!("cargo:rustc-link-search=native={}", dir.display());
            }
        }
        println!("cargo:rustc-link-lib=static=cudart_static");
        for sys in ["dl", "rt", "pthread", "stdc++"] {
            println!("cargo:rustc-link-lib={sys}");
        }
    }
}
