//! `cargo xtask demo`.
