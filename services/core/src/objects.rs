//! The blob store (code bundles, outputs): `object_store` over a local directory for now.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;

use crate::config::ObjectStoreConfig;

/// Opens the object store, creating its root directory.
pub fn open(config: &ObjectStoreConfig) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
    std::fs::create_dir_all(&config.root).map_err(|source| object_store::Error::Generic {
        store: "local",
        source: Box::new(source),
    })?;
    Ok(Arc::new(LocalFileSystem::new_with_prefix(&config.root)?))
}

/// Where the blob with this sha256 digest lives.
pub fn artifact_path(digest: &str) -> ObjectPath {
    ObjectPath::from(format!("artifacts/sha256/{digest}"))
}

/// Tells whether `text` is a lowercase hex sha256 digest.
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}
