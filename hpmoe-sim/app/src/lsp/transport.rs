//! The server's stdio: JSON-RPC messages framed by `Content-Length` headers.
//!
//! `lsp-server`'s own stdio threads allocate whatever length a header announces; these read
//! with limits instead (a header line of at most [`MAX_HEADER_LINE`] bytes, a body of at
//! most [`MAX_BODY`] bytes, checked before allocating) and end the session with a message on
//! stderr on malformed framing. The server side is a [`Connection`] of `lsp-server`; the two
//! threads here move messages between its channels and the process's stdin and stdout.

use lsp_server::{Connection, Message};
use std::io::{self, BufRead, Read, Write};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The longest header line accepted.
pub const MAX_HEADER_LINE: usize = 4096;
/// The largest message body accepted (a document of this size is far beyond any program).
pub const MAX_BODY: usize = 64 << 20;

/// Why the input ended: `None` at a clean end of input.
pub type InputError = Arc<Mutex<Option<String>>>;

/// The reader and writer threads.
#[derive(Debug)]
pub struct Io {
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
    pub input_error: InputError,
}

impl Io {
    /// Waits for the writer to flush everything the server sent (it ends when the server's
    /// connection is dropped). The reader is left to end with the process: it may be blocked
    /// on a stdin that never closes.
    pub fn finish(self) -> Option<String> {
        let _ = self.writer.join();
        drop(self.reader);
        self.input_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A server connection on the process's stdin and stdout.
pub fn stdio() -> (Connection, Io) {
    let (server, client) = Connection::memory();
    let input_error: InputError = Arc::new(Mutex::new(None));
    let to_server = client.sender;
    let from_server = client.receiver;
    let err = Arc::clone(&input_error);
    let reader = std::thread::spawn(move || {
        let stdin = io::stdin();
        let mut input = stdin.lock();
        read_loop(&mut input, |m| to_server.send(m).is_ok(), &err);
    });
    let writer = std::thread::spawn(move || {
        let stdout = io::stdout();
        write_loop(&mut stdout.lock(), from_server.iter());
    });
    (
        server,
        Io {
            reader,
            writer,
            input_error,
        },
    )
}

/// Reads messages and hands them to `send` until the input ends, is malformed, or `send`
/// returns false (the server is gone).
fn read_loop(input: &mut impl BufRead, mut send: impl FnMut(Message) -> bool, err: &InputError) {
    loop {
        match read_message(input) {
            Ok(Some(msg)) => {
                if !send(msg) {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                *err.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                return;
            }
        }
    }
}

fn write_loop(out: &mut impl Write, from_server: impl Iterator<Item = Message>) {
    let mut broken = false;
    // Runs until the server drops its sender; after a write error the messages are still
    // taken from the channel (so the server never blocks or fails on a send) and dropped.
    for msg in from_server {
        if !broken && msg.write(out).is_err() {
            broken = true;
        }
    }
    let _ = out.flush();
}

/// Reads one header line of at most [`MAX_HEADER_LINE`] bytes, without its `\r\n`; `None`
/// at the end of input before any byte.
fn header_line(input: &mut impl BufRead) -> Result<Option<String>, String> {
    let mut buf = Vec::new();
    let n = input
        .by_ref()
        .take(MAX_HEADER_LINE as u64 + 1)
        .read_until(b'\n', &mut buf)
        .map_err(|e| format!("cannot read the input: {e}"))?;
    if n == 0 {
        return Ok(None);
    }
    if buf.len() > MAX_HEADER_LINE {
        return Err(format!("a header line is longer than {MAX_HEADER_LINE} bytes"));
    }
    let Some(line) = buf.strip_suffix(b"\r\n") else {
        return Err(format!(
            "malformed header {:?}: a header line ends with \\r\\n",
            String::from_utf8_lossy(&buf)
        ));
    };
    String::from_utf8(line.to_vec())
        .map(Some)
        .map_err(|_| "a header line is not UTF-8".to_string())
}

/// Reads one framed message; `Ok(None)` at a clean end of input (between messages).
pub fn read_message(input: &mut impl BufRead) -> Result<Option<Message>, String> {
    let mut size = None;
    let mut first = true;
    loop {
        let Some(line) = header_line(input)? else {
            if first {
                return Ok(None);
            }
            return Err("the input ended inside a message's headers".into());
        };
        first = false;
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("malformed header {line:?}: expected `Name: value`"));
        };
        if name.trim().eq_ignore_ascii_case("Content-Length") {
            let n: usize = value
                .trim()
                .parse()
                .map_err(|_| format!("malformed Content-Length {:?}", value.trim()))?;
            size = Some(n);
        }
    }
    let size = size.ok_or("a message has no Content-Length header")?;
    if size > MAX_BODY {
        return Err(format!(
            "a message of {size} bytes is larger than the limit of {MAX_BODY} bytes"
        ));
    }
    let mut body = vec![0u8; size];
    input
        .read_exact(&mut body)
        .map_err(|e| format!("the input ended inside a message of {size} bytes: {e}"))?;
    serde_json::from_slice::<Message>(&body)
        .map(Some)
        .map_err(|e| format!("a message is not a JSON-RPC request, response or notification: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(s: &str) -> Result<Option<Message>, String> {
        read_message(&mut io::Cursor::new(s.as_bytes().to_vec()))
    }

    #[test]
    fn frames() {
        let body = r#"{"jsonrpc":"2.0","id":1,"method":"shutdown"}"#;
        let m = read(&format!("Content-Length: {}\r\n\r\n{body}", body.len())).unwrap();
        assert!(matches!(m, Some(Message::Request(r)) if r.method == "shutdown"));
        assert!(read("").unwrap().is_none());
    }

    #[test]
    fn malformed_framing_is_an_error_not_an_allocation() {
        assert!(read("Content-Length: 99999999999999\r\n\r\n")
            .unwrap_err()
            .contains("limit"));
        assert!(read("Content-Length: x\r\n\r\n")
            .unwrap_err()
            .contains("Content-Length"));
        assert!(read("Content-Type: a\r\n\r\n{}")
            .unwrap_err()
            .contains("no Content-Length"));
        assert!(read("Content-Length: 10\n\n").unwrap_err().contains("\\r\\n"));
        assert!(read("Content-Length: 10\r\n\r\n{}").unwrap_err().contains("ended"));
        assert!(read("Content-Length: 2\r\n\r\n{}").unwrap_err().contains("JSON-RPC"));
        let long = format!("X: {}\r\n\r\n", "a".repeat(MAX_HEADER_LINE));
        assert!(read(&long).unwrap_err().contains("longer"));
    }
}
