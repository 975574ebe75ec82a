//! UI tests of `taskflow!` (trybuild): programs that must not compile, with the compiler's
//! output (`tests/ui/fail/*.stderr`: each error at the tokens it is about), and programs that
//! must compile and run (`tests/ui/pass`).
//!
//! The `.stderr` snapshots depend on the rustc version: they are those of rustc 1.95.0, the
//! toolchain CI runs. After a toolchain change regenerate them with
//! `TRYBUILD=overwrite cargo test -p hpmoe-macros --test ui` and read each diff: the carets
//! must stay on the same tokens.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
