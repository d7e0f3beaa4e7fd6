//! Gives the shared library its SONAME and compiles `kernels/` for a GPU
//! backend through the `cc` crate: with nvcc for the `cuda` feature, with
//! hipcc for `rocm`. Either sets the `unikv_gpu` cfg that compiles the GPU
//! backend in. The test-only sources (kernels/devtools/) and hooks are
//! compiled with the `devtools` feature only. The header is never written
//! here: the `header` test regenerates it into a temporary folder and compares.

#[cfg(all(feature = "cuda", feature = "rocm"))]
compile_error!(
    "the `cuda` and `rocm` features exclude each other: build one GPU backend at a time"
);

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libunikv.so.{major}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(unikv_gpu)");
    #[cfg(feature = "cuda")]
    cuda::build();
    #[cfg(feature = "rocm")]
    rocm::build();
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    println!("cargo:rustc-cfg=unikv_gpu");
}

/// The kernel sources (one compiler run each).
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod kernels {
    pub const SOURCES: &[&str] = &[
        "shim.cu",
        "store.cu",
        "cache_store.cu",
        "prepare.cu",
        "index.cu",
        "rope.cu",
        "attention.cu",
        "routing.cu",
        "indexer.cu",
        "indexer_topk.cu",
    ];
    /// The test-only sources (the `devtools` feature, which `test-hooks`
    /// implies): the tests' and the benchmark's streams, graphs and events,
    /// the FP8 codec check and the params layout table. Never in a library
    /// built without the feature.
    pub const DEVTOOLS_DIR: &str = "kernels/devtools";

    fn devtools() -> bool {
        std::env::var_os("CARGO_FEATURE_DEVTOOLS").is_some()
    }

    /// Every source to compile, from the package root: SOURCES, then with
    /// `devtools` each `.cu` file of DEVTOOLS_DIR.
    pub fn sources() -> Vec<String> {
        let mut list: Vec<String> = SOURCES.iter().map(|s| format!("kernels/{s}")).collect();
        if devtools() {
            let mut tools: Vec<String> = std::fs::read_dir(DEVTOOLS_DIR)
                .unwrap_or_else(|e| panic!("{DEVTOOLS_DIR}: {e}"))
                .map(|entry| {
                    entry
                        .unwrap_or_else(|e| panic!("{DEVTOOLS_DIR}: {e}"))
                        .path()
                })
                .filter(|path| path.extension().is_some_and(|ext| ext == "cu"))
                .map(|path| path.to_string_lossy().into_owned())
                .collect();
            tools.sort();
            list.extend(tools);
        }
        list
    }

    /// The archive of one source: kernels/devtools/streams.cu ->
    /// unikv_kernels_devtools_streams.
    pub fn lib_name(src: &str) -> String {
        let stem = src.trim_start_matches("kernels/").trim_end_matches(".cu");
        format!("unikv_kernels_{}", stem.replace('/', "_"))
    }

    /// With `devtools`, every source is compiled with UKV_TEST_HOOKS, which
    /// compiles in the `unikv_gpu_test_*` hooks of the kernel files.
    pub fn define_test_hooks(build: &mut cc::Build) {
        if devtools() {
            build.define("UKV_TEST_HOOKS", None);
        }
    }

    /// A `;`- or `,`-separated target list from `var` (or `default`); an
    /// empty list is an error naming the variable.
    pub fn target_list(var: &str, default: &str, example: &str) -> Vec<String> {
        println!("cargo:rerun-if-env-changed={var}");
        let archs = std::env::var(var).unwrap_or_else(|_| default.into());
        let list: Vec<String> = archs
            .split([';', ','])
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();
        if list.is_empty() {
            panic!("{var} is empty: name at least one target, e.g. {example}");
        }
        list
    }

    /// Any change under kernels/ (sources and the headers they include).
    pub fn rerun_on_sources() {
        println!("cargo:rerun-if-changed=kernels");
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::kernels::{define_test_hooks, lib_name, rerun_on_sources, sources, target_list};
    use std::env;
    use std::path::PathBuf;

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
        target_list("UNIKV_CUDA_ARCHS", DEFAULT_ARCHS, "sm_90a")
            .iter()
            .map(|arch| {
                let Some(num) = arch.strip_prefix("sm_") else {
                    panic!("UNIKV_CUDA_ARCHS: {arch:?} is not of the form sm_NN[a]");
                };
                format!("-gencode=arch=compute_{num},code=sm_{num}")
            })
            .collect()
    }

    pub fn build() {
        println!("cargo:rerun-if-env-changed=CUDA_HOME");
        let home = find_nvcc();
        rerun_on_sources();
        // One nvcc run per source, each a whole program: with several files in
        // one cc::Build, cc compiles relocatable device code (--device-c), and
        // ptxas then serializes the wgmma instructions of the attention kernel
        // (C7509). No device code crosses files, so nothing needs a device link.
        let builds: Vec<_> = sources()
            .into_iter()
            .map(|src| {
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
                    .file(&src);
                for flag in gencode_flags() {
                    build.flag(&flag);
                }
                define_test_hooks(&mut build);
                let name = lib_name(&src);
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

#[cfg(feature = "rocm")]
mod rocm {
    use super::kernels::{define_test_hooks, lib_name, rerun_on_sources, sources, target_list};
    use std::env;
    use std::path::PathBuf;

    const DEFAULT_ARCHS: &str = "gfx942;gfx950";

    /// hipcc from ROCM_PATH/bin, HIP_PATH/bin or PATH.
    fn find_hipcc() -> PathBuf {
        let mut dirs: Vec<PathBuf> = ["ROCM_PATH", "HIP_PATH"]
            .iter()
            .filter_map(|v| env::var_os(v).map(|h| PathBuf::from(h).join("bin")))
            .collect();
        dirs.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
        dirs.push(PathBuf::from("/opt/rocm/bin"));
        dirs.iter().map(|d| d.join("hipcc")).find(|p| p.is_file()).unwrap_or_else(|| {
            panic!(
                "the `rocm` feature needs hipcc: install ROCm (or Debian's hipcc, libamdhip64-dev and \
                 rocm-device-libs) and put hipcc on PATH or set ROCM_PATH"
            )
        })
    }

    pub fn build() {
        for var in ["ROCM_PATH", "HIP_PATH"] {
            println!("cargo:rerun-if-env-changed={var}");
        }
        let hipcc = find_hipcc();
        rerun_on_sources();
        let archs = target_list("UNIKV_HIP_ARCHS", DEFAULT_ARCHS, "gfx942");
        if let Some(bad) = archs.iter().find(|a| !a.starts_with("gfx")) {
            panic!("UNIKV_HIP_ARCHS: {bad:?} is not an AMD GPU target such as gfx942");
        }
        // AMD targets whatever CUDA toolkit is on PATH; the explicit target
        // list (and HCC_AMDGPU_TARGET for the compiler checks the cc crate
        // runs without our flags) keeps hipcc from probing this machine's GPUs.
        env::set_var("HIP_PLATFORM", "amd");
        env::set_var("HCC_AMDGPU_TARGET", &archs[0]);
        let builds: Vec<_> = sources()
            .into_iter()
            .map(|src| {
                let mut build = cc::Build::new();
                build
                    .cpp(true)
                    .compiler(&hipcc)
                    .debug(false)
                    .opt_level(3)
                    .flag("-x")
                    .flag("hip")
                    .flag("-std=c++17")
                    .flag("-fPIC")
                    .flag("-Wall")
                    .flag("-Wextra")
                    .flag("-Werror")
                    .include("kernels")
                    .file(&src);
                for arch in &archs {
                    build.flag(format!("--offload-arch={arch}"));
                }
                define_test_hooks(&mut build);
                let name = lib_name(&src);
                std::thread::spawn(move || build.compile(&name))
            })
            .collect();
        for build in builds {
            build.join().expect("hipcc build thread");
        }
        for var in ["ROCM_PATH", "HIP_PATH"] {
            if let Some(home) = env::var_os(var) {
                println!(
                    "cargo:rustc-link-search=native={}",
                    PathBuf::from(home).join("lib").display()
                );
            }
        }
        if PathBuf::from("/opt/rocm/lib").is_dir() {
            println!("cargo:rustc-link-search=native=/opt/rocm/lib");
        }
        println!("cargo:rustc-link-lib=dylib=amdhip64");
        println!("cargo:rustc-link-lib=stdc++");
    }
}
