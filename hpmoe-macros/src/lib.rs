//! The hpmoe language inside Rust.
//!
//! `taskflow! { ... }` takes a whole program (imports, params, device, routings, ops,
//! taskflows, schedules: the same text as a `.hpm` file) and expands to a typed handle per
//! taskflow. The program is parsed, checked, lowered, verified and scheduled while the crate
//! compiles; every error is a compile error at the offending tokens. `taskflow_file!("f.hpm")`
//! does the same for a file (relative to the crate's `Cargo.toml`), which is embedded and
//! tracked for rebuilds.
//!
//! The crate using the macros must also depend on `hpmoe-dsl` (the handles use its types).
//! The work is done by `hpmoe_dsl::embed::expand`; this crate only forwards the tokens. See
//! `docs/MACRO.md` for the handle's API.
//!
//! ```ignore
//! use hpmoe_macros::taskflow;
//!
//! taskflow! {
//!     import std::moe::{dispatch, gmm, swiglu, combine};
//!     import std::device::ascend_a3;
//!     param tokens = 4096;
//!     // ...
//!     taskflow moe_ffn(x: bf16[tokens, hidden], /* ... */) -> bf16[tokens, hidden] { /* ... */ }
//! }
//!
//! let compiled = MoeFfn::new().tokens(2048).compile(None)?;
//! println!("{}", compiled.summary());
//! ```

use proc_macro::TokenStream;

/// A program of the hpmoe language, checked and scheduled at compile time; expands to a
/// typed handle per taskflow (a struct named in CamelCase after it, e.g. `MoeFfn` for
/// `moe_ffn`). Use it where items are allowed.
#[proc_macro]
pub fn taskflow(input: TokenStream) -> TokenStream {
    hpmoe_dsl::embed::expand(input.into()).into()
}

/// `taskflow_file!("path/to/program.hpm")`: like [`taskflow!`] for a file, relative to the
/// crate's `CARGO_MANIFEST_DIR`. The file is embedded with `include_str!`, so the crate is
/// rebuilt when it changes; errors are shown at the path with their snippet of the file.
#[proc_macro]
pub fn taskflow_file(input: TokenStream) -> TokenStream {
    hpmoe_dsl::embed::expand_file(input.into()).into()
}
