//! Container image references, as a user gives them (`name[:tag][@digest]`).

/// Longest image reference accepted.
pub const MAX_IMAGE_BYTES: usize = 255;

/// Tells whether `image` looks like an image reference (`name[:tag][@digest]`): at most 255
/// bytes of letters, digits and `._-/:@`, not starting with `-`, `/`, `:` or `@` (so it is
/// never taken for an option or a path).
pub fn valid_reference(image: &str) -> bool {
    image.len() <= MAX_IMAGE_BYTES
        && !image.is_empty()
        && !image.starts_with(['-', '/', ':', '@'])
        && image.chars().all(|c| c.is_ascii_alphanumeric() || "._-/:@".contains(c))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn references_are_what_docker_takes(image in "[a-z0-9][a-z0-9._/-]{0,60}(:[A-Za-z0-9._-]{1,40})?(@sha256:[0-9a-f]{64})?") {
            prop_assert!(valid_reference(&image));
        }

        #[test]
        fn options_paths_and_odd_characters_are_not(image in ".{0,300}") {
            if valid_reference(&image) {
                prop_assert!(image.len() <= MAX_IMAGE_BYTES);
                prop_assert!(!image.starts_with('-') && !image.starts_with('/'));
                prop_assert!(image.bytes().all(|b| b.is_ascii_graphic()));
            }
        }
    }
}
