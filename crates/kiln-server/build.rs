//! Embeds the web studio (`studio/dist`, built by `npm run build` in `studio/` and
//! committed) into the server: every file becomes an `include_bytes!` entry with its
//! content type, a strong ETag (SHA-256 of the bytes) and, when it pays, a gzip copy
//! compressed here at build time. Without `studio/dist` the table is empty and
//! `/studio` answers that the assets were not built; the server builds either way.

use flate2::write::GzEncoder;
use flate2::Compression;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let dist = manifest.join("../../studio/dist");
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut files = Vec::new();
    if dist.is_dir() {
        collect(&dist, &dist, &mut files);
    }
    files.sort();
    let gz_dir = out.join("studio-gz");
    std::fs::create_dir_all(&gz_dir).expect("OUT_DIR is writable");
    let mut table = String::from("pub static ASSETS: &[Asset] = &[\n");
    for (i, rel) in files.iter().enumerate() {
        let path = dist.join(rel);
        println!("cargo:rerun-if-changed={}", path.display());
        let bytes = std::fs::read(&path).expect("a studio asset is readable");
        let etag = format!("\"{}\"", &hex::encode(Sha256::digest(&bytes))[..32]);
        let gzip = compress(&bytes).map(|gz| {
            let gz_path = gz_dir.join(format!("{i}.gz"));
            std::fs::write(&gz_path, gz).expect("OUT_DIR is writable");
            format!("Some(include_bytes!({:?}))", gz_path.display().to_string())
        });
        let _ = writeln!(
            table,
            "    Asset {{ path: {rel:?}, content_type: {:?}, etag: {etag:?}, body: include_bytes!({:?}), gzip: {} }},",
            content_type(rel),
            path.display().to_string(),
            gzip.unwrap_or_else(|| "None".into()),
        );
    }
    table.push_str("];\n");
    std::fs::write(out.join("studio_assets.rs"), table).expect("OUT_DIR is writable");
}

/// Files under `dir`, as '/'-separated paths relative to `root`.
fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir).expect("studio/dist is readable");
    for entry in entries {
        let path = entry.expect("studio/dist is readable").path();
        if path.is_dir() {
            collect(root, &path, out);
        } else if let Ok(rel) = path.strip_prefix(root) {
            let parts: Vec<_> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(parts.join("/"));
        }
    }
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" | "map" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        "woff2" => "font/woff2",
        _ => "application/octet-stream",
    }
}

/// The gzip copy, when the type compresses and it saves at least a tenth.
fn compress(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::best());
    enc.write_all(bytes).ok()?;
    let gz = enc.finish().ok()?;
    (gz.len() < bytes.len() - bytes.len() / 10).then_some(gz)
}
