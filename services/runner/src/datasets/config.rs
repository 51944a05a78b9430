//! The `[dataset-cache]` section of the runner's configuration.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where datasets are kept on the runner's disk, and how much of it they may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct DatasetCacheConfig {
    /// The cache directory; empty: `<work-dir>/.datasets`. Docker engines bind-mount its entries,
    /// so it must be on the engine's host.
    pub dir: PathBuf,
    /// Least recently used entries no running job holds are removed while the cache is larger.
    /// A dataset larger than this still enters (alone); disk is then the only limit.
    pub max_bytes: u64,
}

impl Default for DatasetCacheConfig {
    fn default() -> Self {
        DatasetCacheConfig {
            dir: PathBuf::new(),
            max_bytes: 50 << 30,
        }
    }
}

impl DatasetCacheConfig {
    /// The directory, with the default applied.
    pub fn dir_under(&self, work_dir: &Path) -> PathBuf {
        if self.dir.as_os_str().is_empty() {
            work_dir.join(".datasets")
        } else {
            self.dir.clone()
        }
    }

    pub fn validate(&self, work_dir: &Path, problems: &mut Vec<String>) {
        if self.max_bytes == 0 {
            problems.push("dataset-cache.max-bytes must be at least 1".into());
        }
        // The process provider removes whatever it does not know under the work dir, except
        // hidden directories.
        if let Ok(inside) = self.dir_under(work_dir).strip_prefix(work_dir) {
            let hidden = match inside.components().next() {
                Some(Component::Normal(first)) => first.to_string_lossy().starts_with('.'),
                _ => false,
            };
            if !hidden {
                problems.push(
                    "dataset-cache.dir inside work-dir must be under a hidden directory (such as <work-dir>/.datasets)"
                        .into(),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_dir_is_hidden_under_the_work_dir() {
        let config = DatasetCacheConfig::default();
        let mut problems = Vec::new();
        config.validate(Path::new("/w"), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(config.dir_under(Path::new("/w")), Path::new("/w/.datasets"));
        let visible = DatasetCacheConfig {
            dir: PathBuf::from("/w/cache"),
            max_bytes: 0,
        };
        visible.validate(Path::new("/w"), &mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
