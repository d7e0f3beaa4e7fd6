//! Gives the shared library its SONAME and compiles `kernels/` for a GPU
//! backend through the `cc` crate: with nvcc for the `cuda` feature, with
//! hipcc for `rocm`. Either sets the `unikv_gpu` cfg that compiles the GPU
//! backend in. The header is never written here: the `header` test
//! regenerates it into a temporary folder and compares.

#[cfg(all(feature = "cuda", feature = "rocm"))]
compile_error!(
    "the `cuda` and `rocm` features exclude each other: build one GPU backend at a time"
);

/// The SONAME follows the ABI; the same rule is in CMakeLists.txt, which
/// installs the library under it: before 1.0 every minor version may break
/// the ABI (libunikv.so.0.MINOR), from 1.0 on only a major version
/// (libunikv.so.MAJOR).
fn soname(major: &str, minor: &str) -> String {
    if major == "0" {
        format!("libunikv.so.0.{minor}")
    } else {
        format!("libunikv.so.{major}")
    }
}

fn main() {
    let version = |part: &str| {
        std::env::var(format!("CARGO_PKG_VERSION_{part}")).expect("cargo sets the package version")
    };
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "linux" {
        let soname = soname(&version("MAJOR"), &version("MINOR"));
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(unikv_gpu)");
    #[cfg(feature = "cuda")]
    cuda::build();
    #[cfg(feature = "rocm")]
    rocm::build();
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    println!("cargo:rustc-cfg=unikv_gpu");
    // The compiled GPU targets, for `unikv_get_capabilities` (set by the GPU
    // builds; empty without one).
    #[cfg(not(any(feature = "cuda", feature = "rocm")))]
    println!("cargo:rustc-env=UNIKV_BUILD_GPU_ARCHS=");
    // Whether the CUDA kernels also carry portable PTX (gencode_flags).
    #[cfg(not(feature = "cuda"))]
    println!("cargo:rustc-env=UNIKV_BUILD_PTX=0");
}

/// The kernel sources, their compile runs and the flags every backend shares.
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod kernels {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    /// The test-only sources (the `devtools` feature, which `test-hooks`
    /// implies): the tests' and the benchmark's streams, graphs and events,
    /// the FP8 codec check and the params layout table. Never in a library
    /// built without the feature.
    const DEVTOOLS_DIR: &str = "kernels/devtools";

    fn devtools() -> bool {
        std::env::var_os("CARGO_FEATURE_DEVTOOLS").is_some()
    }

    /// Every `.cu` under `kernels/` (recursively, sorted, so the archive list is
    /// deterministic), each one compiler run; DEVTOOLS_DIR only with the
    /// `devtools` feature.
    pub fn sources() -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            let entries =
                std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            for entry in entries {
                let path = entry.expect("kernels/ entry").path();
                if path.is_dir() {
                    if path != Path::new(DEVTOOLS_DIR) || devtools() {
                        walk(&path, out);
                    }
                } else if path.extension().is_some_and(|x| x == "cu") {
                    out.push(path);
                }
            }
        }
        let mut out = Vec::new();
        walk(Path::new("kernels"), &mut out);
        out.sort();
        out
    }

    /// The static library of one source, unique per path:
    /// kernels/attention/plan.cu -> unikv_kernels_attention_plan.
    pub fn library_name(src: &Path) -> String {
        let rel = src
            .strip_prefix("kernels")
            .expect("a source under kernels/")
            .with_extension("");
        let rel = rel
            .to_string_lossy()
            .replace(std::path::MAIN_SEPARATOR, "_");
        format!("unikv_kernels_{rel}")
    }

    /// With `devtools`, every source is compiled with UKV_TEST_HOOKS, which
    /// compiles in the `unikv_gpu_test_*` hook setters of the kernel files.
    pub fn defines(build: &mut cc::Build) {
        if devtools() {
            build.define("UKV_TEST_HOOKS", None);
        }
    }

    /// Runs the compiles on at most NUM_JOBS threads (cargo's job count), one
    /// compiler process each: kernels/ holds dozens of sources, and as many
    /// concurrent device compiles would exhaust a small machine's memory.
    pub fn compile_all(builds: Vec<(String, cc::Build)>) {
        let jobs = std::env::var("NUM_JOBS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1usize)
            .max(1);
        let queue = Mutex::new(builds);
        std::thread::scope(|scope| {
            for _ in 0..jobs {
                scope.spawn(|| loop {
                    let Some((name, build)) = queue.lock().expect("build queue").pop() else {
                        break;
                    };
                    build.compile(&name);
                });
            }
        });
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
    use super::kernels::{
        compile_all, defines, library_name, rerun_on_sources, sources, target_list,
    };
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
    /// A portable target (sm_NN, no `a`) also embeds its PTX (code=compute_NN,
    /// from the same compile pass), which the driver compiles for a GPU newer
    /// than every target; arch-specific targets (sm_90a) have no portable PTX.
    /// The kernels that then run are the portable ones: the runtime reads the
    /// loaded image's architecture (kernels/shim.cu, `image_arch`) before it
    /// uses a feature of a newer one.
    fn gencode_flags() -> Vec<String> {
        target_list("UNIKV_CUDA_ARCHS", DEFAULT_ARCHS, "sm_90a")
            .iter()
            .map(|arch| {
                let Some(num) = arch.strip_prefix("sm_") else {
                    panic!("UNIKV_CUDA_ARCHS: {arch:?} is not of the form sm_NN[a]");
                };
                if num.ends_with('a') {
                    format!("-gencode=arch=compute_{num},code=sm_{num}")
                } else {
                    format!("-gencode=arch=compute_{num},code=[sm_{num},compute_{num}]")
                }
            })
            .collect()
    }

    pub fn build() {
        println!("cargo:rerun-if-env-changed=CUDA_HOME");
        let home = find_nvcc();
        rerun_on_sources();
        let archs = target_list("UNIKV_CUDA_ARCHS", DEFAULT_ARCHS, "sm_90a");
        println!("cargo:rustc-env=UNIKV_BUILD_GPU_ARCHS={}", archs.join(";"));
        let ptx = archs.iter().any(|a| !a.ends_with('a'));
        println!("cargo:rustc-env=UNIKV_BUILD_PTX={}", u8::from(ptx));
        // One nvcc run per source, each a whole program: with several files in
        // one cc::Build, cc compiles relocatable device code (--device-c), and
        // ptxas then serializes the wgmma instructions of the attention kernel
        // (C7509). No device code crosses files, so nothing needs a device link.
        let builds = sources()
            .iter()
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
                    .file(src);
                defines(&mut build);
                for flag in gencode_flags() {
                    build.flag(&flag);
                }
                (library_name(src), build)
            })
            .collect();
        compile_all(builds);
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
    use super::kernels::{
        compile_all, defines, library_name, rerun_on_sources, sources, target_list,
    };
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
        println!("cargo:rustc-env=UNIKV_BUILD_GPU_ARCHS={}", archs.join(";"));
        // AMD targets whatever CUDA toolkit is on PATH; the explicit target
        // list (and HCC_AMDGPU_TARGET for the compiler checks the cc crate
        // runs without our flags) keeps hipcc from probing this machine's GPUs.
        env::set_var("HIP_PLATFORM", "amd");
        env::set_var("HCC_AMDGPU_TARGET", &archs[0]);
        let builds = sources()
            .iter()
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
                    .file(src);
                defines(&mut build);
                for arch in &archs {
                    build.flag(format!("--offload-arch={arch}"));
                }
                (library_name(src), build)
            })
            .collect();
        compile_all(builds);
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
