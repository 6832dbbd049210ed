//! Builds the faultfs LD_PRELOAD shim with the system C compiler.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "faultfs/faultfs.c";
    println!("cargo:rerun-if-changed={src}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("libfaultfs.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
        .arg(&out)
        .arg(src)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(status.success(), "building {src} failed");
    println!("cargo:rustc-env=FAULTFS_SO={}", out.display());
}
