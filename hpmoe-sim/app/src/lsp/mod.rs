//! `hpmoe lsp`: a language server for `.hpm` files on stdin and stdout (`lsp-server` and
//! `lsp-types`).
//!
//! In: JSON-RPC messages from an editor. Out: diagnostics with their codes and related
//! spans as the text changes; hover (a tensor's dtype and concrete shape, a call's output,
//! tiling and tiles per rank, a param's value, a routing's sizes); go to definition (ops,
//! params, routings, locals, imports, into the stdlib); completion (keywords, ops, params,
//! dtypes, engines, policies, device fields); formatting (`hpmoe fmt`); semantic tokens.
//!
//! - `transport`: the framing on stdio, with limits;
//! - `text`: positions (UTF-16) and byte offsets, incremental edits;
//! - `files`: open documents, URIs, the stdlib as files;
//! - `analysis`: the checker on a document, diagnostics, the definitions index;
//! - `features`: the answers to requests.
//!
//! The loop answers one message at a time. Changes are applied as they come; a changed
//! document is checked again once no message is waiting (so a burst of keystrokes costs
//! one check) or before a request about it is answered. A malformed request gets an error
//! response, never a panic; a request before `initialize` gets `ServerNotInitialized`
//! (`lsp-server`'s handshake). Exit code: 0 after `shutdown` and `exit`, 1 when the input
//! ends or `exit` comes without `shutdown`, the framing is malformed, the open documents
//! would hold more than [`MAX_OPEN_BYTES`] of text together, or the edits of one change would
//! cost more than [`MAX_EDIT_WORK`] (with a message on stderr).

mod analysis;
mod features;
mod files;
mod text;
mod transport;

use files::{Document, Documents};
use lsp_server::{Connection, ErrorCode, Message, Notification, Request, RequestId, Response};
use lsp_types as lsp;
use lsp_types::notification::Notification as _;
use lsp_types::request::Request as _;
use std::str::FromStr;

/// Runs the server on stdio; returns the exit code.
pub fn main() -> i32 {
    let (conn, io) = transport::stdio();
    let result = serve(&conn);
    // Dropping the connection ends the writer once it has written every message.
    drop(conn);
    let input_error = io.finish();
    match (result, input_error) {
        (Ok(()), _) => 0,
        (Err(_), Some(e)) => {
            errln!("error: hpmoe lsp: {e}");
            1
        }
        (Err(e), None) => {
            errln!("error: hpmoe lsp: {e}");
            1
        }
    }
}

fn capabilities() -> lsp::ServerCapabilities {
    lsp::ServerCapabilities {
        text_document_sync: Some(lsp::TextDocumentSyncCapability::Options(lsp::TextDocumentSyncOptions {
            open_close: Some(true),
            change: Some(lsp::TextDocumentSyncKind::INCREMENTAL),
            ..Default::default()
        })),
        hover_provider: Some(lsp::HoverProviderCapability::Simple(true)),
        definition_provider: Some(lsp::OneOf::Left(true)),
        completion_provider: Some(lsp::CompletionOptions {
            trigger_characters: Some(vec![".".into()]),
            ..Default::default()
        }),
        document_formatting_provider: Some(lsp::OneOf::Left(true)),
        semantic_tokens_provider: Some(lsp::SemanticTokensServerCapabilities::SemanticTokensOptions(
            lsp::SemanticTokensOptions {
                legend: lsp::SemanticTokensLegend {
                    token_types: features::TOKEN_TYPES.to_vec(),
                    token_modifiers: features::TOKEN_MODIFIERS.to_vec(),
                },
                full: Some(lsp::SemanticTokensFullOptions::Bool(true)),
                range: None,
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// Waits for the client's `initialize` request, as the protocol asks of a server before it:
/// a request is answered with an error (`ServerNotInitialized`), a notification dropped, and
/// `exit` ends the session (an error: nothing was served).
fn await_initialize(conn: &Connection) -> Result<RequestId, String> {
    loop {
        let Ok(msg) = conn.receiver.recv() else {
            return Err("the input ended before the client's `initialize` request".to_string());
        };
        match msg {
            Message::Request(r) if r.method == lsp::request::Initialize::METHOD => return Ok(r.id),
            Message::Request(r) => {
                let _ = conn.sender.send(Message::Response(Response::new_err(
                    r.id,
                    ErrorCode::ServerNotInitialized as i32,
                    format!("`{}` before `initialize`: the server is not initialized yet", r.method),
                )));
            }
            Message::Notification(n) if n.method == lsp::notification::Exit::METHOD => {
                return Err("the client sent `exit` before `initialize`".to_string());
            }
            Message::Notification(_) | Message::Response(_) => {}
        }
    }
}

fn serve(conn: &Connection) -> Result<(), String> {
    let id = await_initialize(conn)?;
    let result = lsp::InitializeResult {
        capabilities: capabilities(),
        server_info: Some(lsp::ServerInfo {
            name: "hpmoe".into(),
            version: Some(env!("CARGO_PKG_VERSION").into()),
        }),
    };
    let value = serde_json::to_value(result).map_err(|e| e.to_string())?;
    // The result is sent without waiting for `initialized` (which `lsp-server`'s
    // `initialize_finish` would require next): that notification is then ignored like any
    // other unknown one, and a client that sends a request first is answered.
    let _ = conn.sender.send(Message::Response(Response {
        id,
        response_result: Ok(value),
    }));
    let mut server = Server {
        conn,
        docs: Documents::new(),
        shutdown: false,
        fatal: None,
        open_bytes: 0,
    };
    loop {
        let msg = match conn.receiver.recv() {
            Ok(m) => m,
            Err(_) => return Err("the input ended before `shutdown` and `exit`".into()),
        };
        match msg {
            Message::Request(req) => {
                if req.method == lsp::request::Shutdown::METHOD {
                    server.shutdown = true;
                    server.respond(Response::new_ok(req.id, ()));
                    continue;
                }
                if server.shutdown {
                    server.respond(Response::new_err(
                        req.id,
                        ErrorCode::InvalidRequest as i32,
                        "the server is shutting down".into(),
                    ));
                    continue;
                }
                let id = req.id.clone();
                let method = req.method.clone();
                let resp = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.request(req)))
                    .unwrap_or_else(|_| {
                        Response::new_err(
                            id,
                            ErrorCode::InternalError as i32,
                            format!("internal error in `{method}`"),
                        )
                    });
                server.respond(resp);
            }
            Message::Notification(n) => {
                if n.method == lsp::notification::Exit::METHOD {
                    return if server.shutdown {
                        Ok(())
                    } else {
                        Err("`exit` came before `shutdown`".into())
                    };
                }
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.notification(n)));
                if let Some(e) = server.fatal.take() {
                    return Err(e);
                }
            }
            Message::Response(_) => {}
        }
        if conn.receiver.is_empty() {
            server.analyse_changed();
        }
    }
}

struct Server<'c> {
    conn: &'c Connection,
    docs: Documents,
    shutdown: bool,
    /// Why the session must end (a limit the client's messages passed).
    fatal: Option<String>,
    /// The bytes of text the open documents hold together.
    open_bytes: u64,
}

/// The most text the open documents may hold together: a source file's limit
/// ([`hpmoe_dsl::check::MAX_SOURCE_BYTES`]). Opening or changing documents past it ends the
/// session, as a message past the framing's limit does.
pub const MAX_OPEN_BYTES: u64 = hpmoe_dsl::check::MAX_SOURCE_BYTES;

/// The most bytes the edits of one `textDocument/didChange` may scan and move together (each
/// edit costs the length of the text it edits): a few seconds of work. Past it the session
/// ends, as past [`MAX_OPEN_BYTES`].
pub const MAX_EDIT_WORK: u64 = 8 << 30;

/// The parameters of a request, or the error response for malformed ones.
fn params<P: serde::de::DeserializeOwned>(req: &Request) -> Result<P, Response> {
    serde_json::from_value(req.params.clone()).map_err(|e| {
        Response::new_err(
            req.id.clone(),
            ErrorCode::InvalidParams as i32,
            format!("invalid parameters of `{}`: {e}", req.method),
        )
    })
}

fn ok<R: serde::Serialize>(id: RequestId, r: R) -> Response {
    match serde_json::to_value(r) {
        Ok(v) => Response {
            id,
            response_result: Ok(v),
        },
        Err(e) => Response::new_err(id, ErrorCode::InternalError as i32, e.to_string()),
    }
}

impl Server<'_> {
    fn respond(&self, r: Response) {
        let _ = self.conn.sender.send(Message::Response(r));
    }

    fn notify<N: lsp::notification::Notification>(&self, params: N::Params) {
        let _ = self
            .conn
            .sender
            .send(Message::Notification(Notification::new(N::METHOD.into(), params)));
    }

    /// Checks every changed document and publishes its diagnostics.
    fn analyse_changed(&mut self) {
        let changed: Vec<String> = self
            .docs
            .iter()
            .filter(|(_, d)| d.analysis.is_none())
            .map(|(u, _)| u.clone())
            .collect();
        for uri in changed {
            self.analyse(&uri);
        }
    }

    /// Checks a document if it changed since its last check (and publishes the diagnostics).
    fn analyse(&mut self, uri: &str) {
        let Some(doc) = self.docs.get_mut(uri) else {
            return;
        };
        if doc.analysis.is_some() {
            return;
        }
        let a = analysis::analyse(uri, doc.path.as_deref(), &doc.text);
        let Ok(lsp_uri) = lsp::Uri::from_str(uri) else {
            doc.analysis = Some(a);
            return;
        };
        let diagnostics = a.lsp_diagnostics(&lsp_uri);
        let version = Some(doc.version);
        doc.analysis = Some(a);
        self.notify::<lsp::notification::PublishDiagnostics>(lsp::PublishDiagnosticsParams {
            uri: lsp_uri,
            diagnostics,
            version,
        });
    }

    fn notification(&mut self, n: Notification) {
        use lsp::notification::{DidChangeTextDocument, DidCloseTextDocument, DidOpenTextDocument};
        match n.method.as_str() {
            DidOpenTextDocument::METHOD => {
                let Ok(p) = serde_json::from_value::<lsp::DidOpenTextDocumentParams>(n.params) else {
                    return;
                };
                let uri = p.text_document.uri.as_str().to_string();
                let others = self.open_bytes - self.docs.get(&uri).map_or(0, |d| d.text.len() as u64);
                let total = others + p.text_document.text.len() as u64;
                if self.over_limit(total) {
                    return;
                }
                self.open_bytes = total;
                self.docs.insert(
                    uri.clone(),
                    Document {
                        version: p.text_document.version,
                        text: p.text_document.text,
                        path: files::uri_to_path(&uri),
                        analysis: None,
                        formatted: Default::default(),
                    },
                );
            }
            DidChangeTextDocument::METHOD => {
                let Ok(p) = serde_json::from_value::<lsp::DidChangeTextDocumentParams>(n.params) else {
                    return;
                };
                let uri = p.text_document.uri.as_str();
                let Some(len) = self.docs.get(uri).map(|d| d.text.len() as u64) else {
                    return;
                };
                let others = self.open_bytes - len;
                let Some(doc) = self.docs.get_mut(uri) else {
                    return;
                };
                // A change is at most a message long, so the text grows by at most that much
                // before its size is checked. Each edit scans and moves the text it edits:
                // the edits of one notification may together cost at most MAX_EDIT_WORK.
                let mut work = 0u64;
                let edits = p.content_changes.len();
                for c in p.content_changes {
                    work = work.saturating_add(doc.text.len() as u64 + c.text.len() as u64);
                    if work > MAX_EDIT_WORK {
                        self.fatal = Some(format!(
                            "a change of {edits} edits to a document of {} bytes: applying them would scan more than the limit of {MAX_EDIT_WORK} bytes ({} GiB); send the whole text instead",
                            doc.text.len(),
                            MAX_EDIT_WORK >> 30
                        ));
                        return;
                    }
                    text::apply_change(&mut doc.text, c.range, &c.text);
                    let total = others + doc.text.len() as u64;
                    if total > MAX_OPEN_BYTES {
                        self.over_limit(total);
                        return;
                    }
                }
                doc.version = p.text_document.version;
                doc.analysis = None;
                doc.formatted = Default::default();
                self.open_bytes = others + doc.text.len() as u64;
            }
            DidCloseTextDocument::METHOD => {
                let Ok(p) = serde_json::from_value::<lsp::DidCloseTextDocumentParams>(n.params) else {
                    return;
                };
                if let Some(d) = self.docs.remove(p.text_document.uri.as_str()) {
                    self.open_bytes -= d.text.len() as u64;
                    self.notify::<lsp::notification::PublishDiagnostics>(lsp::PublishDiagnosticsParams {
                        uri: p.text_document.uri,
                        diagnostics: Vec::new(),
                        version: None,
                    });
                }
            }
            _ => {}
        }
    }

    /// Whether open documents of `total` bytes would pass [`MAX_OPEN_BYTES`]; if so the
    /// session is to end with that message.
    fn over_limit(&mut self, total: u64) -> bool {
        if total <= MAX_OPEN_BYTES {
            return false;
        }
        self.fatal = Some(format!(
            "the open documents would hold {total} bytes, more than the limit of {MAX_OPEN_BYTES} bytes ({} MiB)",
            MAX_OPEN_BYTES >> 20
        ));
        true
    }

    /// The document of a request, checked; `None` for a document that is not open.
    fn doc(&mut self, uri: &lsp::Uri) -> Option<&Document> {
        self.analyse(uri.as_str());
        self.docs.get(uri.as_str()).filter(|d| d.analysis.is_some())
    }

    fn request(&mut self, req: Request) -> Response {
        use lsp::request::{Completion, Formatting, GotoDefinition, HoverRequest, SemanticTokensFullRequest};
        let id = req.id.clone();
        match req.method.as_str() {
            HoverRequest::METHOD => {
                let p: lsp::HoverParams = match params(&req) {
                    Ok(p) => p,
                    Err(r) => return r,
                };
                let tdp = p.text_document_position_params;
                let Some(doc) = self.doc(&tdp.text_document.uri) else {
                    return ok(id, None::<lsp::Hover>);
                };
                let Some(a) = &doc.analysis else {
                    return ok(id, None::<lsp::Hover>);
                };
                let Some(idx) = a.lines(a.root) else {
                    return ok(id, None::<lsp::Hover>);
                };
                let offset = idx.offset(&doc.text, tdp.position);
                let h = features::hover(a, &doc.text, offset).map(|(value, span)| lsp::Hover {
                    contents: lsp::HoverContents::Markup(lsp::MarkupContent {
                        kind: lsp::MarkupKind::Markdown,
                        value,
                    }),
                    range: Some(idx.range(&doc.text, span.lo as usize, span.hi as usize)),
                });
                ok(id, h)
            }
            GotoDefinition::METHOD => {
                let p: lsp::GotoDefinitionParams = match params(&req) {
                    Ok(p) => p,
                    Err(r) => return r,
                };
                let tdp = p.text_document_position_params;
                let uri = tdp.text_document.uri;
                let Some(doc) = self.doc(&uri) else {
                    return ok(id, None::<lsp::GotoDefinitionResponse>);
                };
                let Some(a) = &doc.analysis else {
                    return ok(id, None::<lsp::GotoDefinitionResponse>);
                };
                let Some(idx) = a.lines(a.root) else {
                    return ok(id, None::<lsp::GotoDefinitionResponse>);
                };
                let offset = idx.offset(&doc.text, tdp.position);
                let loc = features::definition(a, &uri, &doc.text, offset).map(lsp::GotoDefinitionResponse::Scalar);
                ok(id, loc)
            }
            Completion::METHOD => {
                let p: lsp::CompletionParams = match params(&req) {
                    Ok(p) => p,
                    Err(r) => return r,
                };
                let tdp = p.text_document_position;
                let Some(doc) = self.doc(&tdp.text_document.uri) else {
                    return ok(id, None::<lsp::CompletionResponse>);
                };
                let Some(a) = &doc.analysis else {
                    return ok(id, None::<lsp::CompletionResponse>);
                };
                let Some(idx) = a.lines(a.root) else {
                    return ok(id, None::<lsp::CompletionResponse>);
                };
                let offset = idx.offset(&doc.text, tdp.position);
                ok(id, features::completion(a, &doc.text, offset))
            }
            Formatting::METHOD => {
                let p: lsp::DocumentFormattingParams = match params(&req) {
                    Ok(p) => p,
                    Err(r) => return r,
                };
                let Some(doc) = self.docs.get(p.text_document.uri.as_str()) else {
                    return ok(id, None::<Vec<lsp::TextEdit>>);
                };
                ok(id, doc.formatted.get_or_init(|| features::formatting(&doc.text)))
            }
            SemanticTokensFullRequest::METHOD => {
                let p: lsp::SemanticTokensParams = match params(&req) {
                    Ok(p) => p,
                    Err(r) => return r,
                };
                let Some(doc) = self.doc(&p.text_document.uri) else {
                    return ok(id, None::<lsp::SemanticTokensResult>);
                };
                let Some(a) = &doc.analysis else {
                    return ok(id, None::<lsp::SemanticTokensResult>);
                };
                let data = features::semantic_tokens(a, &doc.text);
                ok(
                    id,
                    lsp::SemanticTokensResult::Tokens(lsp::SemanticTokens { result_id: None, data }),
                )
            }
            m => Response::new_err(id, ErrorCode::MethodNotFound as i32, format!("`{m}` is not supported")),
        }
    }
}
