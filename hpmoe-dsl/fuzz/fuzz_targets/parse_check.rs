//! Arbitrary text through the lexer, the parser, the checker, the formatter and the
//! diagnostic renderers: nothing may panic, hang or exhaust memory.
#![no_main]

use hpmoe_dsl::check::{check_text, Options};
use hpmoe_dsl::SourceMap;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut sources = SourceMap::new();
    let out = check_text("fuzz.hpm", &text, None, &Options::default(), &mut sources);
    for d in out.diagnostics.as_slice() {
        let _ = hpmoe_dsl::diag::render(d, &sources, hpmoe_dsl::diag::RenderStyle::Plain);
        let _ = hpmoe_dsl::diag::to_json(d, &sources);
    }
    assert!(out.program.is_some() || out.diagnostics.has_errors());
    if let Ok(formatted) = hpmoe_dsl::syntax::fmt::format_source(&text) {
        // Formatting is idempotent on anything that parses.
        assert_eq!(hpmoe_dsl::syntax::fmt::format_source(&formatted).ok().as_deref(), Some(formatted.as_str()));
    }
});
