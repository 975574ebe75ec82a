//! End-to-end test of `hpmoe lsp`: spawns the binary, speaks JSON-RPC with `Content-Length`
//! framing on its stdin and stdout, and checks the answers: initialize, didOpen (an error:
//! diagnostics with a code and a related span), didChange (the fix: diagnostics cleared),
//! hover, definition (into the stdlib), completion, formatting, semantic tokens, shutdown
//! and exit. Expected values are worked out by hand from the program below, or come from
//! another path through the tool (`hpmoe fmt --stdout`, the stdlib file itself).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

struct Lsp {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
    next_id: i64,
    /// Notifications read while waiting for a response.
    notes: Vec<Value>,
}

impl Lsp {
    fn start() -> Lsp {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hpmoe"))
            .arg("lsp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        Lsp {
            child,
            stdin,
            out,
            next_id: 1,
            notes: Vec::new(),
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let w = self.stdin.as_mut().unwrap();
        w.write_all(bytes).unwrap();
        w.flush().unwrap();
    }

    fn send(&mut self, v: Value) {
        let s = v.to_string();
        self.send_raw(format!("Content-Length: {}\r\n\r\n{s}", s.len()).as_bytes());
    }

    fn read(&mut self) -> Value {
        let mut len = None;
        loop {
            let mut line = String::new();
            assert!(
                self.out.read_line(&mut line).unwrap() > 0,
                "the server closed its output"
            );
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(v) = line.strip_prefix("Content-Length: ") {
                len = Some(v.parse::<usize>().unwrap());
            }
        }
        let mut body = vec![0; len.expect("a Content-Length header")];
        self.out.read_exact(&mut body).unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    /// Sends a request; returns its response (notifications met on the way are kept).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let m = self.read();
            if m.get("method").is_none() && m["id"] == json!(id) {
                return m;
            }
            self.notes.push(m);
        }
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// The next diagnostics published for `uri`.
    fn diagnostics(&mut self, uri: &str) -> Value {
        let is_it = |m: &Value| m["method"] == "textDocument/publishDiagnostics" && m["params"]["uri"] == uri;
        if let Some(i) = self.notes.iter().position(is_it) {
            return self.notes.remove(i)["params"].clone();
        }
        loop {
            let m = self.read();
            if is_it(&m) {
                return m["params"].clone();
            }
            self.notes.push(m);
        }
    }

    /// Closes stdin and waits: the exit status and stderr.
    fn finish(mut self) -> (Option<i32>, String) {
        drop(self.stdin.take());
        let mut err = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = self.child.wait().unwrap();
        (status.code(), err)
    }
}

/// The program of the test. Line numbers (0-based) are used below; `param hidden` is
/// defined twice (line 6), and line 4 is not in the canonical layout.
const PROGRAM: &str = "\
// An elementwise program for the language server's test.
import std::moe::{swiglu};
import std::device::ascend_a3;

param tokens=256;
param hidden = 512;
param hidden = 512;

device = ascend_a3 { ranks: 2 };

/// Doubles every element.
op double<T>(x: T[M, N]) -> T[M, N] on aiv tile(m: 64) {
    out[m, n] = x[m, n] + x[m, n];
}

taskflow f(x: bf16[tokens, 2 * hidden]) -> bf16[tokens, hidden] {
    let y = swiglu(x) tile(m: 64, n: 128);
    return double(y) tile(m: 64, n: 128);
}
";

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn uri_of(p: &Path) -> String {
    format!("file://{}", p.display())
}

fn pos(line: u32, character: u32) -> Value {
    json!({"line": line, "character": character})
}

fn hover_text(r: &Value) -> String {
    r["result"]["contents"]["value"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Decodes semantic tokens into (line, column, length, type name).
fn decode(data: &[Value], legend: &[Value]) -> Vec<(u64, u64, u64, String)> {
    let n: Vec<u64> = data.iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(n.len() % 5, 0);
    let (mut line, mut col) = (0, 0);
    n.chunks(5)
        .map(|c| {
            if c[0] > 0 {
                line += c[0];
                col = c[1];
            } else {
                col += c[1];
            }
            (line, col, c[2], legend[c[3] as usize].as_str().unwrap().to_string())
        })
        .collect()
}

#[test]
fn a_session_of_an_editor() {
    let dir = scratch("lsp-session");
    let file = dir.join("elementwise.hpm");
    std::fs::write(&file, PROGRAM).unwrap();
    let uri = uri_of(&file);
    let mut s = Lsp::start();

    let init = s.request(
        "initialize",
        json!({"processId": null, "rootUri": null, "capabilities": {}}),
    );
    let caps = &init["result"]["capabilities"];
    assert_eq!(caps["hoverProvider"], true);
    assert_eq!(caps["definitionProvider"], true);
    assert_eq!(caps["documentFormattingProvider"], true);
    let legend = caps["semanticTokensProvider"]["legend"]["tokenTypes"]
        .as_array()
        .unwrap()
        .clone();
    s.notify("initialized", json!({}));

    // The duplicate param: an error with its code, at the second definition, the first as
    // related information.
    s.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "hpm", "version": 1, "text": PROGRAM}}),
    );
    let d = s.diagnostics(&uri);
    assert_eq!(d["version"], 1);
    let errors: Vec<&Value> = d["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["severity"] == 1)
        .collect();
    assert_eq!(errors.len(), 1, "{d}");
    let e = errors[0];
    assert_eq!(e["code"], "E0202", "{e}");
    assert_eq!(e["source"], "hpmoe");
    assert_eq!(e["range"]["start"], pos(6, 6));
    assert_eq!(e["range"]["end"], pos(6, 12));
    let related = e["relatedInformation"].as_array().unwrap();
    assert!(
        related
            .iter()
            .any(|r| r["location"]["uri"] == uri && r["location"]["range"]["start"] == pos(5, 6)),
        "{e}"
    );

    // The fix, as an incremental change: line 6 deleted. No error is left.
    s.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri, "version": 2},
               "contentChanges": [{"range": {"start": pos(6, 0), "end": pos(7, 0)}, "text": ""}]}),
    );
    let d = s.diagnostics(&uri);
    assert_eq!(d["version"], 2);
    assert!(
        d["diagnostics"].as_array().unwrap().iter().all(|d| d["severity"] != 1),
        "{d}"
    );
    // From here on the taskflow starts at line 14.

    // A taskflow input: its dtype and concrete shape; 256 x 1024 bf16 is 524288 bytes.
    let h = hover_text(&s.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri}, "position": pos(14, 11)}),
    ));
    assert!(h.contains("x: bf16[256, 1024]"), "{h}");
    assert!(h.contains("524288 bytes per rank"), "{h}");
    // A call: its output [256, 512] in tiles of 64 x 128 is 4 x 4 = 16 tiles on each rank.
    let h = hover_text(&s.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri}, "position": pos(16, 13)}),
    ));
    assert!(h.contains("double"), "{h}");
    assert!(h.contains("bf16[256, 512]"), "{h}");
    assert!(h.contains("16 on each of 2 ranks (32 in all)"), "{h}");
    // A param: its value.
    let h = hover_text(&s.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri}, "position": pos(14, 20)}),
    ));
    assert!(h.contains("param tokens") && h.contains("Value: `256`"), "{h}");

    // Definitions: a stdlib op (its file on disk holds the name at the range), a param, a
    // local `let`.
    let r = s.request(
        "textDocument/definition",
        json!({"textDocument": {"uri": uri}, "position": pos(15, 13)}),
    );
    let loc = &r["result"];
    let target = loc["uri"]
        .as_str()
        .unwrap()
        .strip_prefix("file://")
        .unwrap()
        .to_string();
    assert!(target.ends_with("moe.hpm"), "{loc}");
    let text = std::fs::read_to_string(&target).unwrap();
    let line = text
        .lines()
        .nth(loc["range"]["start"]["line"].as_u64().unwrap() as usize)
        .unwrap();
    let (a, b) = (
        loc["range"]["start"]["character"].as_u64().unwrap() as usize,
        loc["range"]["end"]["character"].as_u64().unwrap() as usize,
    );
    assert_eq!(&line[a..b], "swiglu");
    assert!(line.starts_with("op swiglu<T>"), "{line}");
    let r = s.request(
        "textDocument/definition",
        json!({"textDocument": {"uri": uri}, "position": pos(14, 21)}),
    );
    assert_eq!(r["result"]["uri"], uri);
    assert_eq!(r["result"]["range"]["start"], pos(4, 6));
    let r = s.request(
        "textDocument/definition",
        json!({"textDocument": {"uri": uri}, "position": pos(16, 18)}),
    );
    assert_eq!(r["result"]["range"]["start"], pos(15, 8));

    // Completion: after `on`, the two engines; on an empty line, keywords, ops of the stdlib
    // (imported or not), dtypes and params.
    let r = s.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": uri}, "position": pos(10, 39)}),
    );
    let mut labels: Vec<&str> = r["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    labels.sort();
    assert_eq!(labels, ["aic", "aiv"]);
    let r = s.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": uri}, "position": pos(3, 0)}),
    );
    let labels: Vec<&str> = r["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    for want in [
        "taskflow",
        "grad",
        "swiglu",
        "gmm",
        "bf16",
        "fp8e4m3",
        "tokens",
        "interleaved",
        "double",
    ] {
        assert!(labels.contains(&want), "{want} not in {labels:?}");
    }

    // Formatting: the text `hpmoe fmt` gives for the same file.
    let fixed: String = PROGRAM
        .lines()
        .enumerate()
        .filter(|&(i, _)| i != 6)
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    std::fs::write(&file, &fixed).unwrap();
    let fmt = Command::new(env!("CARGO_BIN_EXE_hpmoe"))
        .args(["fmt", "--stdout"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(fmt.status.success());
    let want = String::from_utf8(fmt.stdout).unwrap();
    assert_ne!(want, fixed, "the test program should not be formatted already");
    let r = s.request(
        "textDocument/formatting",
        json!({"textDocument": {"uri": uri}, "options": {"tabSize": 4, "insertSpaces": true}}),
    );
    let edits = r["result"].as_array().unwrap();
    assert_eq!(edits.len(), 1);
    assert_eq!(edits[0]["range"]["start"], pos(0, 0));
    assert_eq!(edits[0]["range"]["end"], pos(18, 0));
    assert_eq!(edits[0]["newText"], want);

    // Semantic tokens.
    let r = s.request(
        "textDocument/semanticTokens/full",
        json!({"textDocument": {"uri": uri}}),
    );
    let toks = decode(r["result"]["data"].as_array().unwrap(), &legend);
    let at = |l: u64, c: u64| toks.iter().find(|t| t.0 == l && t.1 == c).map(|t| (t.2, t.3.as_str()));
    assert_eq!(at(0, 0), Some((57, "comment")));
    assert_eq!(at(4, 0), Some((5, "keyword")));
    assert_eq!(at(4, 13), Some((3, "number")));
    assert_eq!(at(9, 0), Some((26, "comment")));
    assert_eq!(at(10, 0), Some((2, "keyword")));
    assert_eq!(at(14, 14), Some((4, "type")));
    assert_eq!(at(15, 12), Some((6, "function")));
    assert_eq!(at(10, 39), Some((3, "enumMember")));

    let r = s.request("shutdown", Value::Null);
    assert!(r["result"].is_null() && r.get("error").is_none(), "{r}");
    s.notify("exit", Value::Null);
    let (code, err) = s.finish();
    assert_eq!(code, Some(0), "{err}");
}

/// A program with a routing and a schedule (0-based lines are used below).
const ROUTED: &str = "\
import std::moe::{dispatch, combine};
import std::device::ascend_a3;

param tokens = 64;
param hidden = 256;
param experts = 8;
param topk = 2;

device = ascend_a3 { ranks: 2 };
route r = balanced(experts: experts, topk: topk);

taskflow g(x: bf16[tokens, hidden]) -> bf16[tokens, hidden] {
    let xd = dispatch(x, r) tile(t: 16);
    return combine(xd, r) tile(m: 16);
}

schedule g = interleaved;
";

/// The text a location names, and the whole line it is on.
fn located(loc: &Value) -> (String, String) {
    let path = loc["uri"]
        .as_str()
        .unwrap()
        .strip_prefix("file://")
        .unwrap()
        .to_string();
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text
        .lines()
        .nth(loc["range"]["start"]["line"].as_u64().unwrap() as usize)
        .unwrap_or_default()
        .to_string();
    let a = loc["range"]["start"]["character"].as_u64().unwrap() as usize;
    let b = loc["range"]["end"]["character"].as_u64().unwrap() as usize;
    (line[a..b].to_string(), line)
}

fn labels_of(r: &Value, kind: Option<u64>) -> Vec<String> {
    let mut v: Vec<String> = r["result"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| kind.is_none_or(|k| c["kind"] == k))
        .map(|c| c["label"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn definitions_of_routes_and_imports_completion_of_fields_and_policies() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let file = scratch("lsp-routed").join("routed.hpm");
    std::fs::write(&file, ROUTED).unwrap();
    let uri = uri_of(&file);
    let mut s = Lsp::start();
    s.request("initialize", json!({"capabilities": {}}));
    s.notify("initialized", json!({}));
    s.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "hpm", "version": 1, "text": ROUTED}}),
    );
    let d = s.diagnostics(&uri);
    assert!(d["diagnostics"].as_array().unwrap().is_empty(), "{d}");
    let at = |l: u32, c: u32| json!({"textDocument": {"uri": uri}, "position": pos(l, c)});

    // The routing a call names: its `route` line.
    let r = s.request("textDocument/definition", at(12, 25));
    assert_eq!(r["result"]["uri"], uri);
    assert_eq!(r["result"]["range"]["start"], pos(9, 6));
    // The modules of `import std::...`: the stdlib's own files.
    for (l, c, module, defines) in [(0, 12, "moe.hpm", "op gmm"), (1, 12, "device.hpm", "profile ascend_a3")] {
        let r = s.request("textDocument/definition", at(l, c));
        let path = r["result"]["uri"].as_str().unwrap().strip_prefix("file://").unwrap();
        assert!(path.ends_with(module), "{r}");
        assert!(std::fs::read_to_string(path).unwrap().contains(defines), "{path}");
    }
    // An imported profile: its declaration in the stdlib.
    let r = s.request("textDocument/definition", at(8, 9));
    let (name, line) = located(&r["result"]);
    assert_eq!(name, "ascend_a3");
    assert!(line.starts_with("profile ascend_a3"), "{line}");

    // Inside a device declaration: the device fields are exactly the fields the stdlib's root
    // profile defines (every profile derives from it).
    let device_hpm = std::fs::read_to_string(root.join("stdlib/device.hpm")).unwrap();
    let mut fields: Vec<String> = device_hpm
        .split("profile ascend_910b {")
        .nth(1)
        .unwrap()
        .split("\n}")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("    ")?.split_once(": "))
        .filter(|(name, _)| {
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .map(|(name, _)| name.to_string())
        .collect();
    fields.sort();
    assert!(fields.len() > 30 && fields.contains(&"ranks".to_string()), "{fields:?}");
    // Kind 5 is `Field` in the protocol.
    let r = s.request("textDocument/completion", at(8, 21));
    assert_eq!(labels_of(&r, Some(5)), fields);
    // After `schedule g =`: the policies the stdlib declares, and nothing else.
    let schedule_hpm = std::fs::read_to_string(root.join("stdlib/schedule.hpm")).unwrap();
    let mut policies: Vec<String> = schedule_hpm
        .lines()
        .filter_map(|l| l.strip_prefix("policy ")?.split('(').next())
        .map(str::to_string)
        .collect();
    policies.sort();
    assert_eq!(policies.len(), 3, "{policies:?}");
    let r = s.request("textDocument/completion", at(16, 13));
    assert_eq!(labels_of(&r, None), policies);

    let r = s.request("shutdown", Value::Null);
    assert!(r.get("error").is_none(), "{r}");
    s.notify("exit", Value::Null);
    let (code, err) = s.finish();
    assert_eq!(code, Some(0), "{err}");
}

/// Before `initialize` a notification is dropped and the session goes on, as the protocol
/// asks (it ended the session with Rust's debug form of the message); `exit` there ends it
/// with a message.
#[test]
fn notifications_before_initialize_are_dropped() {
    let mut s = Lsp::start();
    s.notify("initialized", json!({}));
    s.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": "untitled:a", "languageId": "hpm", "version": 1, "text": "param a = 1;"}}),
    );
    let r = s.request("initialize", json!({"capabilities": {}}));
    assert!(r["result"]["capabilities"].is_object(), "{r}");
    let r = s.request("shutdown", Value::Null);
    assert!(r["error"].is_null(), "{r}");
    s.notify("exit", Value::Null);
    let (code, err) = s.finish();
    assert_eq!(code, Some(0), "{err}");

    let mut s = Lsp::start();
    s.notify("exit", Value::Null);
    let (code, err) = s.finish();
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        "error: hpmoe lsp: the client sent `exit` before `initialize`"
    );
}

#[test]
fn hostile_clients_get_errors_not_crashes() {
    let mut s = Lsp::start();
    // A request before `initialize`.
    let r = s.request("textDocument/hover", json!({}));
    assert_eq!(r["error"]["code"], -32002);
    s.request("initialize", json!({"capabilities": {}}));
    // Malformed parameters, an unknown method, a document that is not open.
    let r = s.request("textDocument/hover", json!({"nonsense": 1}));
    assert_eq!(r["error"]["code"], -32602);
    let r = s.request("hpmoe/unknown", json!({}));
    assert_eq!(r["error"]["code"], -32601);
    let r = s.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": "file:///nope.hpm"}, "position": pos(0, 0)}),
    );
    assert!(r["result"].is_null(), "{r}");
    // Positions past the end, inside a surrogate pair, changes with reversed ranges: answers.
    let uri = "untitled:Untitled-1";
    s.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "hpm", "version": 1, "text": "param 𝔸 = 1;\nparam b = ;"}}),
    );
    let d = s.diagnostics(uri);
    assert!(
        d["diagnostics"].as_array().unwrap().iter().any(|d| d["severity"] == 1),
        "{d}"
    );
    for p in [pos(0, 7), pos(99, 99), pos(1, 4000)] {
        let r = s.request(
            "textDocument/hover",
            json!({"textDocument": {"uri": uri}, "position": p}),
        );
        assert!(r.get("error").is_none(), "{r}");
        let r = s.request(
            "textDocument/completion",
            json!({"textDocument": {"uri": uri}, "position": p}),
        );
        assert!(r.get("error").is_none(), "{r}");
        let r = s.request(
            "textDocument/definition",
            json!({"textDocument": {"uri": uri}, "position": p}),
        );
        assert!(r.get("error").is_none(), "{r}");
    }
    s.notify(
        "textDocument/didChange",
        json!({"textDocument": {"uri": uri, "version": 2},
               "contentChanges": [{"range": {"start": pos(9, 0), "end": pos(0, 7)}, "text": "x"}]}),
    );
    let r = s.request(
        "textDocument/semanticTokens/full",
        json!({"textDocument": {"uri": uri}}),
    );
    assert!(r["result"]["data"].is_array(), "{r}");
    // A document that does not parse is not formatted.
    let r = s.request(
        "textDocument/formatting",
        json!({"textDocument": {"uri": uri}, "options": {"tabSize": 4, "insertSpaces": true}}),
    );
    assert!(r["result"].is_null(), "{r}");
    // `exit` without `shutdown`: exit code 1.
    s.notify("exit", Value::Null);
    let (code, err) = s.finish();
    assert_eq!(code, Some(1));
    assert!(err.contains("before `shutdown`") && !err.contains("panicked"), "{err}");
}

#[test]
fn completion_after_a_character_of_several_bytes() {
    // The word under the cursor starts after a character of two to four bytes (`é`, `€`,
    // `𝔸`, a no-break space): every column of every line is answered, none is an error.
    let mut s = Lsp::start();
    s.request("initialize", json!({"capabilities": {}}));
    let uri = "untitled:Untitled-2";
    let text = "param a = 1 €pa;\n// é\u{a0}de\nparam b = 𝔸a;\n";
    s.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "hpm", "version": 1, "text": text}}),
    );
    for (line, l) in text.lines().enumerate() {
        for c in 0..=l.encode_utf16().count() as u32 + 1 {
            let r = s.request(
                "textDocument/completion",
                json!({"textDocument": {"uri": uri}, "position": pos(line as u32, c)}),
            );
            assert!(r.get("error").is_none(), "{line}:{c}: {r}");
        }
    }
    // Right after `€pa`: the word is `pa`, so `param` is offered.
    let r = s.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": uri}, "position": pos(0, 15)}),
    );
    assert!(labels_of(&r, None).iter().any(|l| l == "param"), "{r}");
    s.request("shutdown", Value::Null);
    s.notify("exit", Value::Null);
    let (code, err) = s.finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn malformed_framing_ends_with_a_message() {
    for input in [
        "Content-Length: 99999999999999999\r\n\r\n".to_string(),
        "Content-Length: 3\r\n\r\n{x}".to_string(),
        "no header\n".to_string(),
        String::new(),
    ] {
        let mut s = Lsp::start();
        s.send_raw(input.as_bytes());
        let (code, err) = s.finish();
        assert_eq!(code, Some(1), "{input:?}: {err}");
        assert!(
            err.starts_with("error: hpmoe lsp: ") && !err.contains("panicked"),
            "{input:?}: {err}"
        );
        if input.is_empty() {
            assert!(
                err.contains("the input ended before the client's `initialize`"),
                "{err}"
            );
        }
    }
}

/// The open documents hold at most a source file's limit of text together: growing one by
/// changes, or opening more, past it ends the session with a message (never an abort out of
/// memory); a closed document gives its share back.
#[test]
fn open_documents_are_bounded() {
    let limit = hpmoe_dsl::check::MAX_SOURCE_BYTES as usize;
    let big = format!("// {}\n", "x".repeat(limit / 2));
    let open = |s: &mut Lsp, uri: &str, text: &str| {
        s.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "hpm", "version": 1, "text": text}}),
        );
    };
    // Closing gives the room back.
    let mut s = Lsp::start();
    s.request("initialize", json!({"capabilities": {}}));
    open(&mut s, "file:///tmp/hpmoe-lsp-a.hpm", &big);
    s.notify(
        "textDocument/didClose",
        json!({"textDocument": {"uri": "file:///tmp/hpmoe-lsp-a.hpm"}}),
    );
    open(&mut s, "file:///tmp/hpmoe-lsp-b.hpm", &big);
    s.request("shutdown", Value::Null);
    s.notify("exit", Value::Null);
    let (code, err) = s.finish();
    assert_eq!(code, Some(0), "{err}");
    // A second large document, or a change that grows one past the limit.
    for grow in [false, true] {
        let mut s = Lsp::start();
        s.request("initialize", json!({"capabilities": {}}));
        open(&mut s, "file:///tmp/hpmoe-lsp-a.hpm", &big);
        if grow {
            let at = json!({"line": 0, "character": 0});
            s.notify(
                "textDocument/didChange",
                json!({"textDocument": {"uri": "file:///tmp/hpmoe-lsp-a.hpm", "version": 2},
                       "contentChanges": [{"range": {"start": at, "end": at}, "text": big}]}),
            );
        } else {
            open(&mut s, "file:///tmp/hpmoe-lsp-b.hpm", &big);
        }
        let (code, err) = s.finish();
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.starts_with("error: hpmoe lsp: the open documents would hold") && err.contains("more than the limit"),
            "{err}"
        );
    }
}
