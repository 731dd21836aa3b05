//! Placeholder entry point while the bench tool is being written.
fn main() {}
