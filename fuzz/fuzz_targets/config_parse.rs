//! The configuration parser on arbitrary text: every input is either a config or a list of
//! FILE:LINE:COL errors; never a panic, never a hang.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Only a fixed variable is known, so `${...}` substitution is exercised both ways.
    let env = |name: &str| (name == "FUZZ_VAR").then(|| "127.0.0.1:9".to_string());
    if let Err(errors) = tollgate::config::parse(Path::new("fuzz.yaml"), text, env) {
        for error in &errors.0 {
            assert!(error.line >= 1 && error.col >= 1, "{error}");
        }
    }
});
