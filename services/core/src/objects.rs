//! The blob store (code bundles, outputs, datasets): `object_store` over a local directory or
//! an S3 bucket ([`open`] or [`connect`], from `objects.url`), and the paths kiln keeps its blobs under.

mod store;

use object_store::path::Path as ObjectPath;
pub use store::{ObjectLocation, connect, open};

/// Where the blob with this sha256 digest lives.
pub fn artifact_path(digest: &str) -> ObjectPath {
    ObjectPath::from(format!("artifacts/sha256/{digest}"))
}

/// Tells whether `text` is a lowercase hex sha256 digest.
pub fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Where a job's synced outputs live: `outputs/<job>/<path>`.
pub fn outputs_prefix(job_id: &str) -> ObjectPath {
    ObjectPath::from(format!("outputs/{job_id}"))
}

/// Appends a relative path to a base path.
pub fn join(base: &ObjectPath, relative: &ObjectPath) -> ObjectPath {
    ObjectPath::from_iter(base.parts().chain(relative.parts()))
}

/// Checks a relative path given by a user or a job (`a/b.txt`): only normal components.
pub fn relative_path(text: &str) -> Option<ObjectPath> {
    let parts: Vec<&str> = text
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    if parts.is_empty() || parts.iter().any(|part| *part == ".." || part.contains('\0')) {
        return None;
    }
    ObjectPath::parse(parts.join("/")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_stay_relative() {
        assert_eq!(relative_path("a/./b.txt").unwrap().as_ref(), "a/b.txt");
        assert_eq!(relative_path("/model.txt").unwrap().as_ref(), "model.txt");
        assert!(relative_path("../x").is_none());
        assert!(relative_path("a/../../x").is_none());
        assert!(relative_path("").is_none());
    }

    proptest::proptest! {
        /// Any path a user sends is refused, or becomes one of normal parts that joins under a
        /// base without leaving it.
        #[test]
        fn any_relative_path_stays_under_its_base(text in "[a./\\\x00-]{0,12}|.{0,16}") {
            let base = ObjectPath::from("outputs/job");
            match relative_path(&text) {
                Some(path) => {
                    proptest::prop_assert!(path.parts().all(|part| part.as_ref() != ".." && part.as_ref() != "."));
                    proptest::prop_assert!(join(&base, &path).prefix_matches(&base));
                }
                None => proptest::prop_assert!(
                    text.split('/').all(|part| part.is_empty() || part == ".")
                        || text.split('/').any(|part| part == ".." || part.contains('\0'))
                        || ObjectPath::parse(text.split('/').filter(|p| !p.is_empty() && *p != ".").collect::<Vec<_>>().join("/")).is_err()
                ),
            }
        }
    }
}
