// Vendored (see README.md): the generated bindings are not polyfuse's code,
// so the lints they trip are allowed here rather than fixed.
#![allow(unreachable_patterns, non_snake_case)]
#![allow(clippy::all)]

mod bindings;
pub use bindings::*;
