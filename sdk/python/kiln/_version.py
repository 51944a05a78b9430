# Written by scripts/sdk-stubs.sh from [workspace.package] in Cargo.toml: do not edit.
__version__ = "0.1.0"
